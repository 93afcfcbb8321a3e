"""Outputs on another volume (docs/hero-run.md): an output directory that is a symlink to, or a mount of, another
filesystem keeps being that link or mount when a stage resets or replaces it, and the files land on that volume.
A real tmpfs mount needs root: those tests skip with the reason where the machine does not allow mounting
(conftest.tmpfs)."""

import os
from pathlib import Path

import pytest

from eagle3.errors import Eagle3Error
from eagle3.files import staged_dir
from eagle3.resume import resume_or_reset

from conftest import tmpfs


@pytest.fixture
def mounted(tmp_path):
    with tmpfs(tmp_path / "mnt", "16m") as point:
        yield point


def _linked(tmp_path: Path) -> tuple[Path, Path]:
    volume = tmp_path / "volume" / "hidden"
    volume.mkdir(parents=True)
    project = tmp_path / "project" / "data"
    project.mkdir(parents=True)
    (project / "hidden").symlink_to(volume)
    return project / "hidden", volume


def test_a_reset_empties_a_linked_output_and_keeps_the_link(tmp_path):
    out, volume = _linked(tmp_path)
    assert resume_or_reset(out, {"format": 1}).kept is False
    (out / "train").mkdir()
    (out / "train" / "shard-0.e3sh").write_bytes(b"old settings")
    assert resume_or_reset(out, {"format": 1}).kept is True
    assert resume_or_reset(out, {"format": 2}).kept is False  # other settings: emptied, not removed
    assert out.is_symlink() and out.resolve() == volume.resolve()
    assert sorted(p.name for p in volume.iterdir()) == ["run.json"]


def test_a_replaced_output_stays_behind_its_link(tmp_path):
    out, volume = _linked(tmp_path)
    (volume / "old.parquet").write_bytes(b"old")
    with staged_dir(out) as staging:
        (staging / "train.parquet").write_bytes(b"new")
    assert out.is_symlink() and sorted(p.name for p in volume.iterdir()) == ["train.parquet"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_a_link_to_nothing_is_one_line(tmp_path):
    out = tmp_path / "hidden"
    out.symlink_to(tmp_path / "not-mounted-yet")
    with pytest.raises(Eagle3Error) as caught:
        resume_or_reset(out, {"format": 1})
    assert str(caught.value) == (
        f"{out} links to {tmp_path / 'not-mounted-yet'}, which is not a directory; create it (or remove the link to "
        "keep the output in the project)"
    )


def test_a_mounted_output_is_reset_and_replaced_in_place(mounted):
    assert os.path.ismount(mounted)
    assert resume_or_reset(mounted, {"format": 1}).kept is False
    (mounted / "shard-0.e3sh").write_bytes(b"x")
    assert resume_or_reset(mounted, {"format": 2}).kept is False
    assert sorted(p.name for p in mounted.iterdir()) == ["run.json"]
    with staged_dir(mounted) as staging:
        (staging / "card.json").write_text("{}")
    assert os.path.ismount(mounted) and sorted(p.name for p in mounted.iterdir()) == ["card.json"]
    # A failed stage leaves the previous output whole.
    with pytest.raises(RuntimeError), staged_dir(mounted) as staging:
        (staging / "half.json").write_text("{")
        raise RuntimeError("killed")
    assert sorted(p.name for p in mounted.iterdir()) == ["card.json"]
