"""The GPU kinds a run is planned for (`train.launch.gpu`, `eagle3 init --gpu`, `eagle3 plan --gpu`): dense bf16
TFLOP/s and memory from NVIDIA's datasheets, and a typical on-demand price per GPU-hour in late 2026 (an assumption
`eagle3 plan` names as such)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    bf16_tflops: float  # dense (no sparsity), from NVIDIA's datasheets
    memory_gb: float
    usd_per_hour: float  # a typical on-demand price per GPU-hour in late 2026: an assumption to check


GPUS = {
    "b300": Gpu("NVIDIA B300 SXM", 2250, 288, 6.5),
    "b200": Gpu("NVIDIA B200 SXM", 2250, 180, 5.0),
    "h200": Gpu("NVIDIA H200 SXM", 989, 141, 3.5),
    "h100": Gpu("NVIDIA H100 SXM", 989, 80, 2.5),
    "h200-nvl": Gpu("NVIDIA H200 NVL (PCIe)", 836, 141, 3.0),
    "h100-pcie": Gpu("NVIDIA H100 PCIe", 756, 80, 2.0),
}
