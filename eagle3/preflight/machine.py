"""`eagle3 preflight`'s machine items (eagle3/preflight/run.py): what the machine has, which precision each device
runs fastest in, the all-reduce the training processes would do, and the data path (disk, shard decoding)."""

import math
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from eagle3.preflight.items import GB, Context, Fix, Item
from eagle3.remotes.dvc_settings import dvc_cache_dir, nearest_existing

if TYPE_CHECKING:
    from eagle3.formats.storage import StorageName

MATMUL_SIZE = 1024


def ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def matmul_rate(device: str, dtype_name: str, seconds: float) -> float:
    """GFLOP/s of MATMUL_SIZE² matmuls in `dtype_name` on `device`, timed for about `seconds`."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b  # the first call pays for kernel selection
    sync()
    runs, started = 0, time.perf_counter()
    while True:
        a @ b
        runs += 1
        sync()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return 2 * MATMUL_SIZE**3 * runs / elapsed / 1e9


def measure_machine(context: Context, item: Item) -> None:
    import torch

    from eagle3.environment import capture
    from eagle3.precision import native_bf16, resolve

    cuda = torch.cuda.is_available()
    devices = ["cpu"] + (["cuda:0"] if cuda else [])
    accelerators = [
        {"name": torch.cuda.get_device_name(i), "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
        for i in range(torch.cuda.device_count() if cuda else 0)
    ]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    environment = capture()
    ram = ram_bytes()
    per_dtype = context.budget("machine") / (2 * len(devices))
    precision: dict[str, Any] = {}
    for device in devices:
        kind = device.split(":")[0]
        rates: dict[str, float | None] = {}
        for dtype in ("float32", "bfloat16"):
            if kind == "cuda" and dtype == "bfloat16" and not native_bf16("cuda"):
                rates[dtype] = None  # emulated on this GPU: not a choice to time
                continue
            rates[dtype] = round(matmul_rate(device, dtype, per_dtype), 1)
        timed = {d: rate for d, rate in rates.items() if rate}
        fastest = max(timed, key=lambda d: timed[d])
        precision[kind] = {"gflops": rates, "fastest": fastest, "auto_resolves_to": resolve("auto", kind)}
    description = (
        f"{len(accelerators)} x {accelerators[0]['name']}" if accelerators else f"CPU ({environment['cpu']['model']})"
    ) + (f", {cores} cores, {ram / 2**30:.0f} GiB RAM" if ram else f", {cores} cores")
    from eagle3.locked_environment import driver_version

    item.figures.update(
        description=description,
        nvidia_driver=driver_version(),
        accelerators=accelerators,
        accelerator_count=len(accelerators),
        cpu_cores=cores,
        ram_bytes=ram,
        precision=precision,
        environment=environment,
    )
    item.how.update(
        accelerators="torch.cuda device names and total memory",
        nvidia_driver="nvidia-smi --query-gpu=driver_version (None without one)",
        precision=f"{MATMUL_SIZE}x{MATMUL_SIZE} matmuls per device and dtype, ~{per_dtype:.1f} s each",
        environment="eagle3/environment.py's record, the one every stage writes",
    )
    train = context.params.train.precision
    device_kind = "cuda" if cuda else "cpu"
    chosen = resolve(train, device_kind)
    fastest = precision[device_kind]["fastest"]
    if fastest != chosen:
        rates = precision[device_kind]["gflops"]
        slower = (
            f"train.precision {train} computes in {chosen} on {device_kind}, which ran at {rates[chosen]:g} GFLOP/s "
            f"against {rates[fastest]:g} in {fastest}"
        )
        # A dtype set by hand is a choice (float32 for exact comparisons, say): said, not refused. `auto` is this
        # project's guess at the fastest, and a wrong guess on this machine is what to fix.
        if train != "auto":
            item.figures["slower_precision_chosen"] = slower
            return
        raise Fix(f"{slower}; set train.precision (and generate/extract.dtype) to {fastest}")


def _draft_gradient_bytes(context: Context) -> int:
    parameters = context.figure("training", "draft_parameters")
    if not parameters:
        raise Fix("needs the training item's draft shape; run preflight with the training item")
    return 4 * int(parameters)  # DDP all-reduces the fp32 gradients


def _all_reduce_worker(rank: int, world_size: int, init_file: str, numel: int, backend: str, seconds: float, out: str):
    import torch
    import torch.distributed as dist

    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)  # before the group: NCCL binds each process to its GPU
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    for _ in range(2):
        dist.all_reduce(tensor)
    sync()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while True:
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - started)
        # Every process must run the same number of collectives: rank 0 decides when to stop.
        stop = torch.tensor([time.perf_counter() > deadline or len(times) >= 50], dtype=torch.int32, device=device)
        dist.broadcast(stop, 0)
        if bool(stop.item()):
            break
    if rank == 0:
        Path(out).write_text(",".join(f"{t:.6f}" for t in times), encoding="utf-8")
    dist.destroy_process_group()


def measure_collectives(context: Context, item: Item) -> None:
    import torch
    import torch.multiprocessing as mp

    from eagle3.training.launch import processes_per_node

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    configured = processes_per_node(context.params.train.launch)
    backend = "nccl" if gpus > 1 else "gloo"
    processes = min(configured, gpus) if gpus > 1 else 2
    nbytes = _draft_gradient_bytes(context)
    init_file, out = context.scratch / "collective-init", context.scratch / "collective-times"
    started = time.perf_counter()
    mp.start_processes(
        _all_reduce_worker,
        args=(processes, str(init_file), nbytes // 4, backend, context.budget("collectives") / 2, str(out)),
        nprocs=processes,
        start_method="spawn",
    )
    times = [float(t) for t in out.read_text(encoding="utf-8").split(",")]
    median = statistics.median(times)
    step_s = context.figure("training", "step_seconds")
    item.figures.update(
        backend=backend,
        processes=processes,
        bytes=nbytes,
        seconds_per_all_reduce=round(median, 6),
        algorithm_gbytes_per_s=round(nbytes / median / GB, 3),
        bus_gbytes_per_s=round(nbytes / median / GB * 2 * (processes - 1) / processes, 3),
        added_seconds_per_step=round(median, 6),
        added_share_of_step=round(median / step_s, 4) if step_s else None,
        all_reduces=len(times),
    )
    item.how.update(
        bytes="the configured draft's fp32 gradients (what DDP all-reduces each step)",
        seconds_per_all_reduce=f"median of {len(times)} all-reduces of {processes} {backend} processes "
        f"(spawned: {time.perf_counter() - started:.1f} s with start-up)",
        added_seconds_per_step="one all-reduce per step, not overlapped with the backward (an upper bound)",
        processes="train.launch's processes on this machine; on a machine without GPUs two gloo processes",
    )
    share = item.figures["added_share_of_step"]
    if gpus > 1 and share is not None and share > 0.25:
        raise Fix(
            f"one gradient all-reduce takes {median * 1e3:.1f} ms, {share:.0%} of a training step: check NCCL's "
            "transport (NCCL_DEBUG=INFO shows it; NVLink expected) before training here"
        )


def disk_throughput(directory: Path, seconds: float, limit_bytes: int) -> dict[str, Any]:
    """Sequential write (fsync'd) then read of one scratch file in `directory`, the page cache dropped between
    them, each stopped after about `seconds`/2; the file is removed."""
    chunk = os.urandom(8 << 20)
    path = directory / f".eagle3-preflight-{os.getpid()}.tmp"
    written = 0
    try:
        with open(path, "wb", buffering=0) as handle:
            started = time.perf_counter()
            while written < limit_bytes and time.perf_counter() - started < seconds / 2:
                handle.write(chunk)
                written += len(chunk)
            os.fsync(handle.fileno())
            write_s = time.perf_counter() - started
        with open(path, "rb", buffering=0) as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            read, started = 0, time.perf_counter()
            while handle.readinto(bytearray(len(chunk))) and time.perf_counter() - started < seconds / 2:
                read += len(chunk)
            read_s = time.perf_counter() - started
    finally:
        path.unlink(missing_ok=True)
    return {
        "write_mb_per_s": round(written / write_s / 1e6, 1),
        "read_mb_per_s": round(read / max(read_s, 1e-9) / 1e6, 1),
        "bytes": written,
    }


def decode_rate(samples: list[tuple[bytes, int]], storage: "StorageName", seconds: float) -> float:
    """Tokens/s one process decodes of `samples` (record bytes, tokens), looped for about `seconds`."""
    from eagle3.formats.shards import decode_sample

    tokens, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for record, count in samples:
            decode_sample(record, storage)
            tokens += count
    return tokens / (time.perf_counter() - started)


def planned_states_bytes(context: Context) -> tuple[float | None, str]:
    """Disk the extract stage needs for this project's states: what it stored if it ran, else an upper bound from
    prepare.max_rows samples of extract.max_seq_len tokens at the measured compression ratio."""
    import json

    from eagle3.paths import EXTRACT_METRICS

    try:
        metrics = json.loads((context.root / EXTRACT_METRICS).read_text())
        return float(metrics["bytes_on_disk"]), f"{EXTRACT_METRICS}: bytes_on_disk"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ratio, per_token = (
        context.figure("extraction", "compression_ratio"),
        context.figure("extraction", "raw_bytes_per_token"),
    )
    rows = context.params.prepare.max_rows
    if not ratio or not per_token or rows is None:
        return None, "unknown: no extract metrics, and no measured compression ratio or prepare.max_rows"
    tokens = rows * context.params.extract.max_seq_len
    return tokens * per_token / ratio, (
        f"at most: prepare.max_rows {rows} x extract.max_seq_len {context.params.extract.max_seq_len} tokens x "
        f"{per_token} raw bytes / measured ratio {ratio:g}"
    )


SHARED_MEMORY = Path("/dev/shm")


def shared_memory_problem(context: Context, item: Item, workers: int) -> str | None:
    """What this machine's training may hold in /dev/shm at once (stored states: the batches its DataLoader workers
    hand over; streamed: the spool, where train.stream_dir is there) against its size (a container's default is
    64 MB; the workers then die with a bus error hours into the run); the problem in one line, or None. Figures
    in `item` (the data path's)."""
    train = context.params.train
    size = shutil.disk_usage(SHARED_MEMORY).total if SHARED_MEMORY.is_dir() else None
    item.figures["shared_memory_bytes"] = size
    item.how["shared_memory_bytes"] = f"shutil.disk_usage({SHARED_MEMORY})"
    needed = _spool_in_memory(context) if train.hidden_states == "streamed" else _loader_hand_over(context, workers)
    item.figures["shared_memory_needed_bytes"] = None if needed is None else needed.bytes
    if needed is None or size is None:
        return None
    item.how["shared_memory_needed_bytes"] = f"{needed.who}: {needed.figures}"
    if size >= needed.bytes:
        return None
    give = math.ceil(needed.bytes / GB)
    return (
        f"{SHARED_MEMORY} holds {size / GB:,.1f} GB, {needed.who} up to {needed.bytes / GB:,.1f} GB there "
        f"({needed.figures}): give it {give} GB (docker run --shm-size {give}g) or {needed.fix}"
    )


class SharedMemoryNeed(NamedTuple):
    bytes: int
    who: str  # what holds them, as the subject of "... up to N GB there"
    figures: str  # how they add up
    fix: str  # the setting that lowers them


def _loader_hand_over(context: Context, workers: int) -> SharedMemoryNeed | None:
    """Stored states: what the DataLoader workers of this machine's training processes may hold in /dev/shm."""
    import torch

    from eagle3.training.data import PREFETCH_BATCHES, loader_shared_memory, tokens_per_process

    train, extract = context.params.train, context.params.extract
    hidden = getattr(context.provenance, "hidden_size", None)
    if workers == 0 or hidden is None:
        return None
    per_node = train.launch.processes_per_node
    processes = per_node if isinstance(per_node, int) else max(torch.cuda.device_count(), 1)
    layers = len(extract.aux_layer_ids or [None] * 3) + 1
    tokens = tokens_per_process(
        train.max_tokens_per_batch, train.batch_size, processes * train.launch.nodes, extract.max_seq_len
    )
    return SharedMemoryNeed(
        processes * loader_shared_memory(tokens, layers, hidden, workers),
        f"the DataLoader workers of {processes} training process(es) hand over",
        f"{workers} worker(s) x {PREFETCH_BATCHES} batches of {tokens:,} tokens each, {layers} layers x {hidden} "
        "values x 2 bytes a token",
        "lower train.num_workers",
    )


def _spool_in_memory(context: Context) -> SharedMemoryNeed | None:
    """Streamed states: what the spool holds in /dev/shm where train.stream_dir is there; None elsewhere."""
    from eagle3.training.streamed import spool_dir

    train = context.params.train
    spool = spool_dir(context.root, train).resolve()
    if not spool.is_relative_to(SHARED_MEMORY.resolve()):
        return None
    return SharedMemoryNeed(
        round(train.stream_buffer_gb * GB),
        f"the streamed states' spool in {spool} keeps",
        f"train.stream_buffer_gb {train.stream_buffer_gb:g}",
        "lower train.stream_buffer_gb, or put train.stream_dir on a disk",
    )


def measure_data_path(context: Context, item: Item) -> None:
    from eagle3.paths import HIDDEN_DIR

    params = context.params
    budget = context.budget("data_path")
    places = {"data/hidden": context.root / HIDDEN_DIR, "dvc_cache": dvc_cache_dir(context.root)}
    disks: dict[str, Any] = {}
    for name, place in places.items():
        existing = nearest_existing(place)
        free = shutil.disk_usage(existing).free
        disks[name] = {
            "path": str(place),
            "measured_at": str(existing),
            "free_bytes": free,
            **disk_throughput(existing, budget / 4, min(1 << 30, free // 10)),
        }
    item.figures["disks"] = disks
    item.figures["free_bytes"] = disks["data/hidden"]["free_bytes"]
    item.how["disks"] = (
        "shutil.disk_usage; one scratch file written with fsync, page cache dropped (posix_fadvise), read back, "
        f"~{budget / 8:.1f} s each way"
    )
    need, need_source = planned_states_bytes(context)
    item.figures["needed_states_bytes"] = need
    item.how["needed_states_bytes"] = need_source
    problems = []
    reserve = params.extract.reserve_free_gb * GB
    if need is not None and disks["data/hidden"]["free_bytes"] < need + reserve:
        problems.append(
            f"data/hidden has {disks['data/hidden']['free_bytes'] / GB:,.1f} GB free, the states need "
            f"{need / GB:,.1f} GB + extract.reserve_free_gb {params.extract.reserve_free_gb:g}: free space there or "
            "move data/hidden to a larger disk"
        )
    import torch

    from eagle3.training.data import data_workers
    from eagle3.training.distributed import Dist

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workers = data_workers(params.train, Dist(device=device))
    shared = shared_memory_problem(context, item, workers)
    if shared:
        problems.append(shared)
    if context.encoded_samples:
        per_process = decode_rate(context.encoded_samples, params.extract.storage, budget / 4)
        feed = per_process * max(workers, 1)
        train_rate = context.figure("training", "tokens_per_s")
        item.figures.update(
            decode_tokens_per_s_per_worker=round(per_process, 1),
            loader_workers=workers,
            loader_tokens_per_s=round(feed, 1),
            loaders_keep_up=None if train_rate is None else feed >= train_rate,
        )
        item.how["decode_tokens_per_s_per_worker"] = (
            f"decode_sample of the extraction item's real states ({params.extract.storage}), one process; the "
            "loader's workers decode independently, so x train.num_workers as resolved"
        )
        if train_rate is not None and feed < train_rate:
            problems.append(
                f"the loader decodes {feed:,.0f} tokens/s with {workers} worker(s), training takes {train_rate:,.0f}: "
                f"raise train.num_workers to {math.ceil(train_rate / per_process)}"
            )
    else:
        item.figures["loaders_keep_up"] = None
        item.how["loaders_keep_up"] = "not measured: the extraction item captured no states"
    if problems:
        raise Fix("; ".join(problems))
