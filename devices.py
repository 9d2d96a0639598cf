"""Device and precision choices shared by training, decoding and the benchmarks: device `auto` means
CUDA, then Apple's MPS, then the CPU; dtype `auto` means bf16 autocast on CUDA and fp32 elsewhere."""
import torch


def pick_device(name: str, allow_mps: bool = True) -> str:
    """The device a run asked for; `auto` resolves to cuda, mps (when allow_mps) or cpu, in that order."""
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if allow_mps and torch.backends.mps.is_available() else "cpu"


def uses_bf16(dtype: str, device_type: str) -> bool:
    """Whether a run with this dtype setting (auto | bfloat16 | float32) runs under bf16 autocast: auto
    does on CUDA (the paper's runs), not elsewhere (bf16 is slow on CPUs without avx512_bf16)."""
    return dtype == "bfloat16" or (dtype == "auto" and device_type == "cuda")
