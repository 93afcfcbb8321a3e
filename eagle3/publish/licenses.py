"""Which input licenses let us publish a draft trained from them, and the publish gate.

A draft is derived from every input: its training targets are the verifier's
own outputs and hidden states, and its training prompts come from the
datasets. So every input's license must allow redistributing weights derived
from it. Licenses are named by SPDX-like ids as the Hugging Face Hub spells
them (lower case: `apache-2.0`, `cc-by-nc-4.0`, `llama3.1`).

Classes (the table below; docs/publishing.md "Licenses" says it for users):

- permissive: redistribution of derived weights is allowed, at most with
  attribution, which the model card gives (every input, its license, its
  source). Passes the gate.
- conditional: allowed only under terms this tool cannot check: share-alike
  licenses (the draft would have to carry the same license) and model
  licenses with custom terms (Kimi's `modified-mit` attribution rule, the
  Llama/Gemma/Qwen licenses' naming, use-policy and "no training other
  models on outputs" clauses, OpenRAIL use restrictions). Someone has to read
  the terms, so these need an explicit override with a written reason.
- forbidden: non-commercial, no-derivatives, research-only, proprietary.
  An override is still possible (e.g. a separate agreement with the
  licensor), and its reason is printed in the report and the card.
- unknown: missing, `other`, `unknown`, or an id not in the table: blocks
  until it is spelled as a known id or overridden.
"""

import re
from dataclasses import dataclass

from eagle3.errors import Eagle3Error
from eagle3.params.report import LicenseOverride

PERMISSIVE = "permissive"
CONDITIONAL = "conditional"
FORBIDDEN = "forbidden"
UNKNOWN = "unknown"

_PERMISSIVE_IDS = {
    "apache-2.0": "Apache 2.0",
    "mit": "MIT",
    "mit-0": "MIT No Attribution",
    "bsd-2-clause": "BSD 2-clause",
    "bsd-3-clause": "BSD 3-clause",
    "bsd-3-clause-clear": "BSD 3-clause Clear",
    "isc": "ISC",
    "zlib": "zlib",
    "bsl-1.0": "Boost 1.0",
    "unlicense": "The Unlicense",
    "wtfpl": "WTFPL",
    "postgresql": "PostgreSQL",
    "ncsa": "NCSA",
    "afl-3.0": "Academic Free License 3.0",
    "ecl-2.0": "Educational Community License 2.0",
    "etalab-2.0": "Etalab Open License 2.0",
    "cc0-1.0": "CC0 1.0 (public domain)",
    "pddl": "ODC Public Domain Dedication",
    "cc-by-2.0": "CC BY 2.0 (attribution)",
    "cc-by-2.5": "CC BY 2.5 (attribution)",
    "cc-by-3.0": "CC BY 3.0 (attribution)",
    "cc-by-4.0": "CC BY 4.0 (attribution)",
    "odc-by": "ODC Attribution",
    "cdla-permissive-1.0": "CDLA Permissive 1.0",
    "cdla-permissive-2.0": "CDLA Permissive 2.0",
}
_CONDITIONAL_IDS = {
    "cc-by-sa-3.0": "share-alike: the draft must be released under the same license",
    "cc-by-sa-4.0": "share-alike: the draft must be released under the same license",
    "odbl": "share-alike database license",
    "cdla-sharing-1.0": "share-alike data license",
    "gpl-2.0": "copyleft",
    "gpl-3.0": "copyleft",
    "lgpl-2.1": "copyleft",
    "lgpl-3.0": "copyleft",
    "agpl-3.0": "copyleft",
    "mpl-2.0": "file-level copyleft",
    "epl-2.0": "copyleft",
    "gfdl": "copyleft",
    "modified-mit": "MIT plus an attribution clause for large deployments (Kimi)",
    "llama2": "Llama 2 community license: use policy; bars improving other LLMs with its outputs",
    "llama3": "Llama 3 community license: naming, attribution and use-policy terms",
    "llama3.1": "Llama 3.1 community license: naming, attribution and use-policy terms",
    "llama3.2": "Llama 3.2 community license: naming, attribution and use-policy terms",
    "llama3.3": "Llama 3.3 community license: naming, attribution and use-policy terms",
    "llama4": "Llama 4 community license: naming, attribution and use-policy terms",
    "gemma": "Gemma terms of use: use restrictions pass on to derived models",
    "qwen": "Qwen license: custom terms",
    "tongyi-qianwen": "Tongyi Qianwen license: custom terms",
    "deepseek": "DeepSeek model license: use restrictions pass on to derived models",
    "openrail": "OpenRAIL: use restrictions pass on to derived models",
    "openrail++": "OpenRAIL++: use restrictions pass on to derived models",
    "bigscience-openrail-m": "OpenRAIL-M: use restrictions pass on to derived models",
    "creativeml-openrail-m": "OpenRAIL-M: use restrictions pass on to derived models",
    "bigcode-openrail-m": "OpenRAIL-M: use restrictions pass on to derived models",
    "bigscience-bloom-rail-1.0": "BLOOM RAIL: use restrictions pass on to derived models",
}
_FORBIDDEN_IDS = {
    "proprietary": "proprietary",
    "research-only": "research use only",
    "deepfloyd-if-license": "research use only",
    "fair-noncommercial-research-license": "non-commercial research only",
}
# Every CC variant with NC (non-commercial) or ND (no derivatives), any version.
_CC_RESTRICTED = re.compile(r"^cc-by(-sa)?(-nc|-nd)(-sa|-nd)?-\d(\.\d)?$")
_MISSING = {"", "unknown", "other", "none", "noassertion", "unlicensed"}

# License ids the Hugging Face Hub accepts in a card's `license:`; anything else is `license: other` + `license_name`.
HUB_LICENSE_IDS = (set(_PERMISSIVE_IDS) - {"mit-0"}) | {
    "cc-by-sa-3.0",
    "cc-by-sa-4.0",
    "odbl",
    "cdla-sharing-1.0",
    "gpl-2.0",
    "gpl-3.0",
    "lgpl-2.1",
    "lgpl-3.0",
    "agpl-3.0",
    "mpl-2.0",
    "epl-2.0",
    "gfdl",
    "llama2",
    "llama3",
    "llama3.1",
    "llama3.2",
    "llama3.3",
    "llama4",
    "gemma",
    "openrail",
    "openrail++",
    "bigscience-openrail-m",
    "creativeml-openrail-m",
    "bigcode-openrail-m",
    "bigscience-bloom-rail-1.0",
    "deepfloyd-if-license",
    "cc-by-nc-2.0",
    "cc-by-nc-3.0",
    "cc-by-nc-4.0",
    "cc-by-nd-4.0",
    "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0",
    "cc-by-nc-sa-2.0",
    "cc-by-nc-sa-3.0",
    "cc-by-nc-sa-4.0",
}


def normalize(license_id: str | None) -> str:
    """'Apache 2.0', 'CC-BY-4.0 ' -> 'apache-2.0', 'cc-by-4.0'; None -> ''."""
    return re.sub(r"\s+", "-", (license_id or "").strip().lower())


def classify(license_id: str | None) -> tuple[str, str]:
    """(class, why) for one license id."""
    key = normalize(license_id)
    if key in _MISSING:
        return UNKNOWN, "no license recorded" if not key else f"{key!r} does not name the terms"
    if key in _PERMISSIVE_IDS:
        return PERMISSIVE, _PERMISSIVE_IDS[key]
    if key in _CONDITIONAL_IDS:
        return CONDITIONAL, _CONDITIONAL_IDS[key]
    if key in _FORBIDDEN_IDS:
        return FORBIDDEN, _FORBIDDEN_IDS[key]
    if _CC_RESTRICTED.match(key):
        restriction = " and ".join(
            word for flag, word in (("-nc", "non-commercial"), ("-nd", "no derivatives")) if flag in key
        )
        return FORBIDDEN, restriction
    if "noncommercial" in key or "non-commercial" in key or "research" in key:
        return FORBIDDEN, "non-commercial or research-only terms"
    return UNKNOWN, f"{key!r} is not in eagle3's license table (eagle3/publish/licenses.py)"


@dataclass(frozen=True)
class LicensedInput:
    kind: str  # verifier | dataset | sub-source
    name: str
    license: str | None


def gate(inputs: list[LicensedInput], overrides: list[LicenseOverride]) -> list[dict]:
    """One decision per input; raises Eagle3Error naming every input that blocks publication."""
    reasons = {normalize(item.license): item.reason.strip() for item in overrides}
    decisions, blocked = [], []
    for item in inputs:
        key = normalize(item.license)
        category, why = classify(key)
        override = reasons.get(key) if key else None
        allowed = category == PERMISSIVE or override is not None
        decisions.append(
            {
                "kind": item.kind,
                "name": item.name,
                "license": key or None,
                "class": category,
                "terms": why,
                "allowed": allowed,
                "override_reason": override if category != PERMISSIVE else None,
            }
        )
        if not allowed:
            blocked.append(f"{item.kind} {item.name!r} is {key or 'unlicensed'} ({category}: {why})")
    if blocked:
        example = next(d["license"] for d in decisions if not d["allowed"]) or "<license id>"
        raise Eagle3Error(
            f"license gate: {len(blocked)} input(s) do not allow publishing derived weights: {'; '.join(blocked)}. "
            f"Replace them, or if you hold the rights, add to params.yaml report.license_overrides: "
            f'[{{license: {example}, reason: "<why publishing is allowed>"}}] (the reason is printed in the report and '
            "card)"
        )
    return decisions


def unused_overrides(inputs: list[LicensedInput], overrides: list[LicenseOverride]) -> list[str]:
    used = {normalize(item.license) for item in inputs}
    return sorted(normalize(item.license) for item in overrides if normalize(item.license) not in used)


def hub_license_fields(license_id: str) -> dict[str, str]:
    """The model card's license keys: a Hub id as is, anything else as `other` + `license_name`."""
    key = normalize(license_id)
    return {"license": key} if key in HUB_LICENSE_IDS else {"license": "other", "license_name": key}
