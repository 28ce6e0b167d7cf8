"""Compile the engine's Triton kernels for a GPU this machine does not have.

CI has no GPU: there the kernels' arithmetic runs under Triton's interpreter, which never
lowers them. A kernel that the interpreter runs can still fail on a GPU: in the compiler
(a construct or type the lowering rejects), in ``ptxas``, or at load (registers spilled to
local memory, too much shared memory). :func:`compile_only` makes Triton's active driver
one that reports an NVIDIA target (``sm_90`` by default: H100 and H200) and launches
nothing, so the engine's own launch code (``sample_rows``, ``decode_attention``, ...) runs
on CPU tensors and every launch is compiled by Triton's real pipeline down to a cubin with
the ``ptxas`` Triton ships. Each launch is recorded with the resources ``ptxas`` gave the
kernel (read back with Triton's ``cuobjdump``).

Run it in a process of its own, for one target: the active driver is global to Triton,
and each kernel keeps what it compiled (and its target) per device for the process's life.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver

# What a launch may use per streaming multiprocessor, by compute capability (CUDA's tables)
MAX_SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
MAX_THREADS = 1024
MAX_REGISTERS = 255
_ARCH: int | None = None  # the one target this process compiles for
_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass
class Launch:
    """One kernel launch as compiled for the target."""

    kernel: str
    grid: tuple[int, int, int]
    num_warps: int
    registers: int  # per thread
    stack_bytes: int
    local_bytes: int  # spills (and local arrays): 0 in a kernel that keeps to registers
    shared_bytes: int  # static + Triton's dynamic shared memory
    constexprs: dict[str, object] = field(default_factory=dict)

    def problems(self, arch: int) -> list[str]:
        """What would keep this launch off the target, or slow it for a reason ``ptxas``
        reports: spills, and limits a real load would raise ``OutOfResources`` for."""

        found = []
        if self.local_bytes or self.stack_bytes:
            found.append(f"{self.local_bytes} B local / {self.stack_bytes} B stack "
                         "(registers spilled)")
        if self.registers > MAX_REGISTERS:
            found.append(f"{self.registers} registers a thread")
        if self.shared_bytes > MAX_SHARED_BYTES.get(arch, MAX_SHARED_BYTES[80]):
            found.append(f"{self.shared_bytes} B shared memory")
        if self.num_warps * 32 > MAX_THREADS:
            found.append(f"{self.num_warps * 32} threads")
        return found

    def as_dict(self) -> dict:
        return asdict(self)


def _usage(cubin: bytes) -> tuple[int, int, int, int]:
    """(registers, stack, shared, local) of the only function in ``cubin``."""

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                              text=True, timeout=60, check=True)
    match = _USAGE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {done.stdout[-500:]}")
    registers, stack, shared, local = (int(g) for g in match.groups())
    return registers, stack, shared, local


class CompileOnlyDriver:
    """A Triton driver for an NVIDIA target that compiles every launch and runs none.

    Triton loads a kernel by asking for its launcher, then loading its binary: the binary
    is only inspected here (``cuobjdump``), and the launcher records the launch.
    """

    def __init__(self, arch: int = 90) -> None:
        self.arch = arch
        self.launches: list[Launch] = []
        self.utils = self  # Triton reaches the loader through ``driver.active.utils``
        self._loading: _Launcher | None = None

    # what triton.runtime.jit and triton.compiler ask of the active driver
    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def launcher_cls(self, src, metadata) -> _Launcher:
        self._loading = _Launcher(self, src, metadata)
        return self._loading

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": MAX_SHARED_BYTES.get(self.arch, MAX_SHARED_BYTES[80]),
                "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name: str, cubin: bytes, shared: int, device: int):
        if self._loading is None:
            raise RuntimeError(f"{name}: a binary loaded before its launcher")
        registers, stack, static_shared, local = _usage(cubin)
        self._loading.usage = registers, stack, max(static_shared, shared), local
        self._loading = None
        return None, None, registers, local // 4, MAX_THREADS  # as CUDA's: spills = local/4


class _Launcher:
    """The launcher of one compiled kernel: records each launch, touches no memory."""

    def __init__(self, owner: CompileOnlyDriver, src, metadata) -> None:
        self.owner = owner
        self.metadata = metadata
        self.constexprs = {src.fn.arg_names[k[0]]: v for k, v in src.constants.items()
                           if len(k) == 1 and isinstance(v, (bool, int, float, str))}
        self.usage: tuple[int, int, int, int] | None = None

    def __call__(self, grid_0: int, grid_1: int, grid_2: int, stream, function,
                 packed_metadata, launch_metadata, enter_hook, exit_hook, *args) -> None:
        if self.usage is None:
            raise RuntimeError(f"{self.metadata.name}: launched before its binary was loaded")
        registers, stack, shared, local = self.usage
        self.owner.launches.append(Launch(
            self.metadata.name, (grid_0, grid_1, grid_2), self.metadata.num_warps, registers,
            stack, local, shared, dict(self.constexprs)))


@contextlib.contextmanager
def compile_only(arch: int = 90) -> Iterator[CompileOnlyDriver]:
    """Within: Triton compiles for ``sm_<arch>`` (in a cache of its own) and launches
    nothing; the yielded driver lists the launches."""

    global _ARCH
    if _ARCH not in (None, arch):
        raise RuntimeError(f"this process compiled for sm_{_ARCH}: Triton's kernels keep "
                           f"their first target, so sm_{arch} needs a process of its own")
    _ARCH = arch
    fake = CompileOnlyDriver(arch)
    with tempfile.TemporaryDirectory() as cache:
        previous = triton.knobs.cache.dir, triton.knobs.runtime.interpret
        active = driver._active  # None until asked for: a CPU box has no driver to reset to
        triton.knobs.cache.dir, triton.knobs.runtime.interpret = cache, False
        driver.set_active(fake)
        try:
            yield fake
        finally:
            driver._active = active
            triton.knobs.cache.dir, triton.knobs.runtime.interpret = previous
