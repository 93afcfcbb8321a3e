"""One table of `extract.storage` choices (eagle3/formats/storage.py): every place that needs a storage's facts
agrees with it, so adding a storage is one row there."""

import subprocess
import sys
from typing import get_args

import pytest
import torch

from eagle3.formats.shards import FP8, decode_sample, encode_sample
from eagle3.formats.storage import DEFAULT_STORAGE, STORAGES, StorageName
from eagle3.params.extract import ExtractParams


def test_params_accept_exactly_the_tables_storages():
    assert get_args(StorageName) == tuple(STORAGES)  # the options, written out for the type checker, are the table's
    for name in STORAGES:
        assert ExtractParams(storage=name).storage == name
    assert ExtractParams().storage == DEFAULT_STORAGE
    with pytest.raises(ValueError, match="fp4"):
        ExtractParams(storage="fp4")


@pytest.mark.parametrize("name", list(STORAGES))
def test_the_codec_encodes_every_role_of_every_storage(name):
    storage = STORAGES[name]
    assert {storage.aux, storage.final} <= {"bf16", *FP8}
    generator = torch.Generator().manual_seed(0)
    hidden = (torch.randn(4, 9, 16, generator=generator) * 3).to(torch.bfloat16)
    ids, mask = torch.arange(9), torch.ones(9, dtype=torch.bool)
    buffers, _, _ = encode_sample(ids, mask, hidden, storage=name)
    _, _, decoded = decode_sample(b"".join(bytes(b) for b in buffers), name)
    for layers, encoding in ((slice(0, 3), storage.aux), (slice(3, 4), storage.final)):
        error = float((decoded[layers].float() - hidden[layers].float()).norm() / hidden[layers].float().norm())
        assert error == 0 if encoding == "bf16" else 0 < error < 0.1, (name, encoding, error)


def test_planning_figures_are_ordered_like_the_encodings():
    # Fewer bytes per value means a higher planning ratio and a higher gain; lossless is the unit of gain.
    assert STORAGES[DEFAULT_STORAGE].gain_over_lossless == 1.0
    by_gain = sorted(STORAGES, key=lambda n: STORAGES[n].gain_over_lossless)
    assert by_gain == sorted(STORAGES, key=lambda n: STORAGES[n].planning_ratio)


def test_plan_offers_the_tables_storages():
    result = subprocess.run([sys.executable, "-m", "eagle3.cli", "plan", "--help"], capture_output=True, text=True)
    assert "{" + ",".join(STORAGES) + "}" in result.stdout.replace("\n", "").replace(" ", "")


def test_loading_params_stays_light():
    """The params types take the table without importing torch or the codecs."""
    script = "import sys; import eagle3.params.extract; print(sorted({'torch', 'zstandard'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
