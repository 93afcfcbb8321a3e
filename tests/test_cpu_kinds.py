"""tests/cpu_kinds.py, the caps that run the suite as another kind of CPU: they take effect, and a promise the
caps do not keep, or a kind the CPU cannot be, is refused in one line."""

import dataclasses

from cpu_kinds import KINDS, check, cpu_flags


def test_every_machine_runs_the_avx2_kind_and_its_caps_take_effect():
    # Every kind these machines come in has AVX2; under the caps torch dispatches AVX2 and bf16 is not native.
    assert "avx2" in cpu_flags()
    assert check("avx2") is None


def test_a_kind_the_caps_do_not_make_is_refused():
    claims_avx512 = dataclasses.replace(KINDS["avx2"], capability="AVX512")
    assert check("avx2", claims_avx512) == (
        "avx2: under the caps torch reports capability AVX2 and bf16 native False, not AVX512 and False"
    )
    claims_native = dataclasses.replace(KINDS["avx2"], bf16_native=True)
    assert "bf16 native False, not AVX2 and True" in check("avx2", claims_native)


def test_a_kind_this_cpu_lacks_the_instructions_for_is_refused():
    beyond = dataclasses.replace(KINDS["amx"], needs=("amx_bf16", "no_such_flag"))
    assert check("amx", beyond).startswith("amx: this CPU lacks ") and "no_such_flag" in check("amx", beyond)


def test_a_kind_whose_caps_stop_vllm_on_this_cpu_is_refused():
    # avx2 is in every CPU's flags, so a kind declared to stop vLLM there is refused here, before any probe runs.
    stops = dataclasses.replace(KINDS["avx2"], stops_vllm_on={"avx2": "vLLM stops"})
    assert check("avx2", stops) == "avx2: vLLM stops, and the suite runs vLLM; run it on a CPU of this kind, uncapped"
    if "amx_tile" in cpu_flags():
        assert "SIGILL" in check("avx512-bf16")
