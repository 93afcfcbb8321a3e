"""The shipped configurations (eagle3/configs/NAME.yaml) and the YAML round trip that keeps their comments, for
`eagle3 init` (eagle3/tools/configs.py) and the files it sizes for other verifiers (eagle3/tools/init_verifier.py)."""

from pathlib import Path

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
# A one-machine recipe's own files (eagle3/tools/recipes.py): RECIPES_DIR/NAME/recipe.json and the model's files.
RECIPES_DIR = CONFIGS_DIR / "verifiers"


def recipes() -> list[str]:
    """The one-machine recipes (`eagle3 init NAME --layout single`)."""
    return sorted(path.parent.name for path in RECIPES_DIR.glob("*/recipe.json"))


def shipped() -> list[str]:
    """The hero-run configurations (`eagle3 init NAME --layout A|B|C`)."""
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml") if path.stem not in recipes())


def shipped_names() -> str:
    """Every name `eagle3 init NAME` takes, with its layouts, for messages."""
    return ", ".join(
        [*(f"{name} (--layout A, B or C)" for name in shipped()), *(f"{name} (--layout single)" for name in recipes())]
    )


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
