"""Reading params.yaml into typed sections: strict YAML, and every problem as one line naming its key path.

Any problem (unreadable file, bad YAML, duplicate or unknown key, wrong type, out-of-range value) raises
Eagle3Error whose message is one line naming the key path, e.g.
``params.yaml: prepare.heldout_rows: must be >= 1, got 0``. Generic over the model validated: a stage validates
the sections it reads (eagle3/runner.py), `eagle3 check` all of them (eagle3/params/params_file.py).
"""

import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from eagle3.errors import Eagle3Error
from eagle3.paths import PARAMS_FILE

ModelT = TypeVar("ModelT", bound=BaseModel)
# YAML 1.1, which PyYAML reads, needs a dot in a float's mantissa: 1e30 stays a string, 1.0e30 is a float.
_EXPONENT_WITHOUT_DOT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, which plain YAML silently resolves to the last one."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


# The params file this process runs with, where it is not the project's params.yaml (the runner's --params).
_params_file: Path | None = None


def use_params_file(path: Path) -> None:
    global _params_file
    _params_file = path.resolve()


def project_params_file(root: Path) -> Path:
    """The params file of the project at `root` this process runs with."""
    return _params_file or root / PARAMS_FILE


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Eagle3Error(f"{path}: file not found (run from the project root, or pass --params PATH)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Eagle3Error(f"{path}: cannot read: {exc}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise Eagle3Error(f"{where}: invalid YAML: {problem}") from None


def validate(raw: object, model: type[ModelT], path: Path) -> ModelT:
    """`raw` (params.yaml as read) as `model`, or Eagle3Error naming the first problem's key path."""
    if not isinstance(raw, dict):
        raise Eagle3Error(
            f"{path}: expected a mapping of sections ({', '.join(model.model_fields)}), got {type(raw).__name__}"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # A value no member of a union accepts is one problem, reported once per member.
        places = {_walk(model, error["loc"])[0] for error in errors}
        more = f" (and {len(places) - 1} more problem(s))" if len(places) > 1 else ""
        raise Eagle3Error(f"{path}: {describe_error(errors[0], model)}{more}") from None


def describe_error(error: ErrorDetails, root: type[BaseModel]) -> str:
    """One pydantic error of validating `root` -> 'key.path: what is wrong', with the union tags pydantic adds to
    locations removed."""
    loc = _walk(root, error["loc"])[0]
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, error["loc"][:-1])
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"{_dotted(loc)}: unknown key{hint}"
    if kind == "missing":
        return f"{_dotted(loc)}: required key is missing"
    comparisons = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in comparisons:
        bound = next(iter(ctx.values()))
        return f"{_dotted(loc)}: must be {comparisons[kind]} {bound}, got {value!r}{_yaml_number_hint(value, kind)}"
    if kind == "union_tag_invalid":
        key = f"{_dotted(loc)}.{ctx['discriminator'].strip(chr(39))}"
        return f"{key}: must be one of {ctx['expected_tags']}, got {ctx['tag']!r}"
    if kind == "union_tag_not_found":
        return f"{_dotted(loc)}: required key {ctx['discriminator']} is missing"
    if kind == "literal_error":
        return f"{_dotted(loc)}: must be one of {ctx['expected']}, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"{_dotted(loc)}: {value!r} does not match the required form {ctx['pattern']}"
    message = error["msg"].removeprefix("Value error, ")
    if message[1:2].islower():  # "Input should be" -> "input should be", but keep "URL ..."
        message = message[0].lower() + message[1:]
    if not loc:  # a rule across sections names its own keys
        return message
    if kind.endswith(("_type", "_parsing")) or kind.startswith("url_") or kind == "finite_number":
        return f"{_dotted(loc)}: {message}, got {value!r}{_yaml_number_hint(value, kind)}"
    return f"{_dotted(loc)}: {message}"


def _yaml_number_hint(value: object, kind: str) -> str:
    """What to write instead of a number YAML read as a string (1e30: a string to YAML 1.1, 1.0e30 a float)."""
    if not (isinstance(value, str) and _EXPONENT_WITHOUT_DOT.fullmatch(value.strip())):
        return ""
    if kind.startswith("int"):
        return f" (YAML reads {value.strip()} as a string; write the integer's digits)"
    mantissa, exponent = re.split("[eE]", value.strip())
    return f" (YAML reads {value.strip()} as a string; write {mantissa}.0e{exponent})"


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _walk(root: type[BaseModel], loc: tuple) -> tuple[tuple, Any]:
    """Follow a pydantic error location from `root`: (the location as the YAML spells it, the model reached).

    pydantic inserts the discriminator tag of a union member (e.g. 'pypi-gguf')
    into locations; it selects the member here and is left out of the path.
    """
    model: Any = root
    kept: list = []
    for part in loc:
        tags = _tags(model)
        if isinstance(part, str) and part in tags:
            model = tags[part]
            continue
        if isinstance(part, str) and _is_plain_union(model):
            member = next((m for m in _members(model) if _child(m, part) is not None), None)
            if member is None:  # pydantic's name for the member it tried, e.g. 'constrained-int'
                model = None
                continue
            model = member
        kept.append(part)
        model = _child(model, part)
    return tuple(kept), model


def _allowed_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    model = _walk(root, loc)[1]
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _child(model: Any, part: str | int) -> Any:
    """The annotation one step below `model` at `part` (a field name or a list index)."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        field = model.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    origin = typing.get_origin(model)
    if origin is typing.Annotated:
        return _child(typing.get_args(model)[0], part)
    if origin is list and isinstance(part, int):
        return typing.get_args(model)[0]
    return None


def _members(model: Any) -> tuple:
    if typing.get_origin(model) is typing.Annotated:
        model = typing.get_args(model)[0]
    return typing.get_args(model) if typing.get_origin(model) in (typing.Union, types.UnionType) else ()


def _is_plain_union(model: Any) -> bool:
    return bool(_members(model)) and not _tags(model)


def _tags(model: Any) -> dict[str, type[BaseModel]]:
    """For a discriminated union annotation: {tag: model class}; else {}."""
    if typing.get_origin(model) is typing.Annotated:
        model = typing.get_args(model)[0]
    members = typing.get_args(model) if typing.get_origin(model) in (typing.Union, types.UnionType) else ()
    tags = {}
    for member in members:
        if isinstance(member, type) and issubclass(member, BaseModel) and "kind" in member.model_fields:
            for tag in typing.get_args(member.model_fields["kind"].annotation):
                tags[tag] = member
    return tags
