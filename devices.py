"""Device choice shared by the two training scripts: `auto` means CUDA, then Apple's MPS, then the CPU."""
import torch


def pick_device(name: str, allow_mps: bool = True) -> str:
    """The device a run asked for; `auto` resolves to cuda, mps (when allow_mps) or cpu, in that order."""
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if allow_mps and torch.backends.mps.is_available() else "cpu"
