"""The shipped one-machine recipes (`eagle3 init NAME --layout single`): `eagle3 init --verifier`'s output for a
model, made from that model's own small files at a pinned Hub revision, kept in eagle3/configs/verifiers/NAME/
verbatim (config.json, generation_config.json, the chat template, README.md, model.safetensors.index.json for the
weights' size) beside recipe.json: the Hub id and revision, and the choices its files cannot make (the GPU kind and
count it is sized for, thinking on or off, a license override).

eagle3/configs/NAME.yaml is that output at the recipe's own GPUs, committed so it can be read; a test writes it again
from the files and compares, so the recipe and `init --verifier` cannot drift apart. Another GPU kind or count
sizes it again from the same files.

    python -m eagle3.init.recipes            # check that every eagle3/configs/NAME.yaml is what its files give
    python -m eagle3.init.recipes --write    # write them
"""

import argparse

from eagle3.init.files import CONFIGS_DIR, recipe, recipes


def render_recipe(
    name: str,
    gpu: str | None = None,
    gpus: int | None = None,
    thinking: bool | None = None,
    license_override: str | None = None,
) -> str:
    """The params text of recipe `name`, sized for `gpus` x `gpu`, with thinking and a license override as given
    (each default: the recipe's own)."""
    from eagle3.init.from_verifier import params_for
    from eagle3.init.verifier_files import read_verifier

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
        raise SystemExit(f"not what their files give: {', '.join(outdated)}; run python -m eagle3.init.recipes --write")


if __name__ == "__main__":
    main()
