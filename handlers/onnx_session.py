"""An ONNX Runtime session behind the same call as a torch module: tensors in, a tensor out.

TorchServe's BaseHandler cannot serve a session (it calls `.to(device)` on it and calls it like a
module: serve issues #2033, #3030) and gives it every logical CPU as intra-op threads, the same
oversubscription that collapses a worker per core. Here the session gets the worker's thread
budget, one inter-op thread, full graph optimisation, and is called with the batch's tensors as
NumPy views (no copy: the collated tensors are contiguous CPU tensors). On the CPU provider the
session leaves Add + LayerNormalization unfused: ONNX Runtime's SkipLayerNormalization kernel runs
them slower there than the two ops it replaces (docs/optimisations.md#onnx-runtime).
"""

from __future__ import annotations

from pathlib import Path

import torch

from handlers.errors import ConfigError

# Graph rewrites the CPU provider's session skips: each one measured slower than what it fuses.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


class OnnxModule:
    """`module(*tensors)` for an ONNX graph; the first output, as a torch tensor."""

    def __init__(self, session) -> None:
        self.session = session
        self.input_names: tuple[str, ...] = tuple(i.name for i in session.get_inputs())
        self.output_name = session.get_outputs()[0].name

    @property
    def intra_op_threads(self) -> int:
        """The session's intra-op threads, read back from the session itself (what it runs with)."""
        return int(self.session.get_session_options().intra_op_num_threads)

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        if len(tensors) != len(self.input_names):
            raise ConfigError(f"the ONNX graph takes {len(self.input_names)} input(s) {list(self.input_names)}, "
                              f"the family collated {len(tensors)}")
        feeds = {name: t.detach().cpu().contiguous().numpy() for name, t in zip(self.input_names, tensors)}
        (output,) = self.session.run([self.output_name], feeds)
        return torch.from_numpy(output)

    def eval(self) -> OnnxModule:  # the build's loaders treat every served model alike
        return self


def load_onnx(path: Path, threads: int, provider="CPUExecutionProvider") -> OnnxModule:
    """`provider`: a name, or (name, options): ("CUDAExecutionProvider", {"device_id": n}) on a GPU
    (onnxruntime-gpu; handlers/device.py checks it). A session that asked for a GPU and came up on the
    CPU provider alone (ONNX Runtime falls back silently when the CUDA libraries do not load) is a
    ConfigError: the worker would otherwise serve from the CPU while placed on a GPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning threads burn the cores the worker's neighbours were planned on between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    wanted = provider if isinstance(provider, str) else provider[0]
    providers = [provider] if wanted == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    disabled = list(CPU_DISABLED_OPTIMIZERS) if wanted == "CPUExecutionProvider" else None
    session = ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)
    running = session.get_providers()
    if running[:1] != [wanted]:
        raise ConfigError(f"runtime.graph: onnx asked ONNX Runtime for {wanted} and the session runs on {running} "
                          "(its CUDA libraries did not load: see the worker log's onnxruntime lines; install the "
                          "CUDA and cuDNN versions onnxruntime-gpu was built for, or serve a torchscript or eager "
                          "variant on the GPU)")
    return OnnxModule(session)
