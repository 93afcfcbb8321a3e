"""The shipped one-machine recipes (`eagle3 init NAME --layout single`): `eagle3 init --verifier`'s output for a
model, made from that model's own small files at a pinned Hub revision, kept in eagle3/configs/verifiers/NAME/
verbatim (config.json, generation_config.json, the chat template, README.md, model.safetensors.index.json for the
weights' size) beside recipe.json: the Hub id and revision, and the choices its files cannot make (the GPU kind and
count it is sized for, thinking on or off, a license override).

eagle3/configs/NAME.yaml is that output at the recipe's own GPUs, committed so it can be read; a test writes it again
from the files and compares, so the recipe and `init --verifier` cannot drift apart. Another GPU kind or count
sizes it again from the same files.

    python -m eagle3.tools.recipes            # check that every eagle3/configs/NAME.yaml is what its files give
    python -m eagle3.tools.recipes --write    # write them
"""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from eagle3.errors import Eagle3Error
from eagle3.tools.config_files import CONFIGS_DIR, RECIPES_DIR, recipes

# Where a recipe expects the weights; the machine's own place is EAGLE3_VERIFIER_PATH.
MODELS_DIR = "/models"


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


def render_recipe(
    name: str,
    gpu: str | None = None,
    gpus: int | None = None,
    thinking: bool | None = None,
    license_override: str | None = None,
) -> str:
    """The params text of recipe `name`, sized for `gpus` x `gpu`, with thinking and a license override as given
    (each default: the recipe's own)."""
    from eagle3.tools.init_verifier import params_for, read_verifier

    chosen = recipe(name)
    verifier = read_verifier(chosen.files, chosen.hub_id, None)
    origin = (
        f"The recipe {name}: {chosen.hub_id} at revision {chosen.revision}, sized from its files\n"
        f"(eagle3/configs/verifiers/{name}/). Fetch the weights (elsewhere: set EAGLE3_VERIFIER_PATH) with\n"
        f"  hf download {chosen.hub_id} --revision {chosen.revision} --local-dir {chosen.weights_path}"
    )
    return params_for(
        verifier,
        gpu or chosen.gpu,
        gpus or chosen.gpus,
        chosen.thinking if thinking is None else thinking,
        False,
        license_override or chosen.license_override,
        source_path=chosen.weights_path,
        origin=origin,
    )


def stale() -> list[str]:
    """The recipes whose eagle3/configs/NAME.yaml is not what their files give."""
    return [
        name
        for name in recipes()
        if not (CONFIGS_DIR / f"{name}.yaml").is_file()
        or (CONFIGS_DIR / f"{name}.yaml").read_text(encoding="utf-8") != render_recipe(name)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write every recipe's params file")
    args = parser.parse_args()
    if args.write:
        for name in recipes():
            (CONFIGS_DIR / f"{name}.yaml").write_text(render_recipe(name), encoding="utf-8")
        return
    outdated = stale()
    if outdated:
        raise SystemExit(
            f"not what their files give: {', '.join(outdated)}; run python -m eagle3.tools.recipes --write"
        )


if __name__ == "__main__":
    main()
