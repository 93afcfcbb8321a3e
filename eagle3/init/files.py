"""The shipped configurations (eagle3/configs/NAME.yaml), the one-machine recipes' own files and choices
(eagle3/configs/verifiers/NAME/recipe.json), and the YAML round trip that keeps their comments, for
`eagle3 init` (eagle3/init/shipped.py) and the files it sizes for other verifiers (eagle3/init/from_verifier.py)."""

import json
from dataclasses import dataclass
from pathlib import Path

from eagle3.errors import Eagle3Error

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
# A one-machine recipe's own files (eagle3/init/recipes.py): RECIPES_DIR/NAME/recipe.json and the model's files.
RECIPES_DIR = CONFIGS_DIR / "verifiers"
# Where a recipe expects the weights; the machine's own place is EAGLE3_VERIFIER_PATH.
MODELS_DIR = "/models"


def recipes() -> list[str]:
    """The one-machine recipes (`eagle3 init NAME --layout single`)."""
    return sorted(path.parent.name for path in RECIPES_DIR.glob("*/recipe.json"))


def shipped() -> list[str]:
    """The hero-run configurations (`eagle3 init NAME --layout A|B|C`)."""
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.yaml") if path.stem not in recipes())


def shipped_for(verifier_name: str) -> str | None:
    """The shipped hero-run configuration whose verifier is `verifier_name`, if any."""
    for name in shipped():
        text = (CONFIGS_DIR / f"{name}.yaml").read_text(encoding="utf-8")
        if f"name: {verifier_name}" in text:
            return name
    return None


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


@dataclass(frozen=True)
class Recipe:
    name: str  # the recipe's (and its directory's) name
    hub_id: str
    revision: str
    gpu: str
    gpus: int
    thinking: bool | None
    license_override: str | None

    @property
    def files(self) -> Path:
        return RECIPES_DIR / self.name

    @property
    def weights_path(self) -> str:
        return f"{MODELS_DIR}/{self.hub_id.split('/')[-1]}"


def recipe(name: str) -> Recipe:
    path = RECIPES_DIR / name / "recipe.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Recipe(
            name=name,
            hub_id=data["hub_id"],
            revision=data["revision"],
            gpu=data["gpu"],
            gpus=int(data["gpus"]),
            thinking=data.get("thinking"),
            license_override=data.get("license_override"),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Eagle3Error(f"{path}: not a recipe ({type(exc).__name__}: {exc})") from None


def recipe_for(hub_id: str) -> Recipe | None:
    """The recipe for the verifier with this Hub id, if one is shipped."""
    return next((chosen for chosen in map(recipe, recipes()) if chosen.hub_id == hub_id), None)
