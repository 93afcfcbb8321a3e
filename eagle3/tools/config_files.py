"""The shipped configurations (eagle3/configs/NAME.yaml) and the YAML round trip that keeps their comments, for
`eagle3 init` (eagle3/tools/configs.py) and the files it sizes for other verifiers (eagle3/tools/init_verifier.py)."""

from pathlib import Path

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"


def shipped() -> list[str]:
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml"))


def yaml_round_trip():
    """ruamel.yaml set to read and write params files with their comments, quotes and layout kept."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 120
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml
