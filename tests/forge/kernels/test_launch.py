"""`forge.kernels.launch.DirectLauncher` on the CPU, with a stand-in kernel and driver: the first
launch of a key goes through Triton's dispatch, later ones straight to the compiled kernel's C
launcher with every argument in signature order; launch hooks, other devices and other keys fall
back to Triton. (On the GPU, `tests/forge/test_gpu.py` checks direct launches against Triton's own, bit
for bit.)"""

import pytest
import torch
from triton import knobs

import forge.kernels.launch as launch
from forge.kernels.launch import DirectLauncher, tensor_facts


class _Compiled:
    function, packed_metadata = "cu-function", "packed"

    def __init__(self, launches: list):
        self.launches = launches

    def run(self, *args):  # what Triton's C launcher receives
        self.launches.append(("direct", args))


class _Kernel:
    """Stands in for a @triton.jit kernel: two runtime arguments, then two compile-time ones."""

    arg_names = ["x_ptr", "n", "BLOCK", "MODE"]

    def __init__(self):
        self.launches: list = []

    def __getitem__(self, grid):
        def dispatch(*args, **kwargs):
            self.launches.append(("triton", grid, args, kwargs))
            return _Compiled(self.launches)

        return dispatch


class _Driver:
    class active:
        device = 0

        @classmethod
        def get_current_device(cls):
            return cls.device

        @staticmethod
        def get_current_stream(device):
            return 1000 + device


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(launch, "driver", _Driver)
    _Driver.active.device = 0
    direct = DirectLauncher(_Kernel())
    direct._interpreted = False  # as on a GPU
    return direct


def test_second_launch_of_a_key_skips_tritons_dispatch(launcher):
    launcher("key", (3,), ("x", 7), {"MODE": "a", "BLOCK": 64}, {"num_warps": 4})
    launcher("key", (3, 2), ("y", 8), {"MODE": "a", "BLOCK": 64}, {"num_warps": 4})
    first, second = launcher.kernel.launches
    # Triton's own first launch, with FP_FUSION asked for by name (Triton 3.10 changes its default)
    assert first == (
        "triton",
        (3,),
        ("x", 7),
        {"MODE": "a", "BLOCK": 64, "num_warps": 4, "enable_fp_fusion": True},
    )
    # grid padded to three dimensions, this device's stream, no launch metadata or hooks, then the
    # runtime arguments and the compile-time ones in the kernel's signature order
    assert second == ("direct", (3, 2, 1, 1000, "cu-function", "packed", None, None, None, "y", 8, 64, "a"))
    assert launcher.direct_launches == 1


def test_another_key_or_device_goes_through_triton_first(launcher):
    launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    launcher("other", (1,), ("x", 7), {"BLOCK": 64, "MODE": "b"}, {})
    _Driver.active.device = 1
    launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    assert [entry[0] for entry in launcher.kernel.launches] == ["triton", "triton", "triton", "direct"]
    assert launcher.kernel.launches[-1][1][3] == 1001  # device 1's stream


def test_an_installed_launch_hook_gets_tritons_own_launch(launcher):
    hook = getattr(knobs.runtime.launch_enter_hook, "add", None)
    if hook is None:
        pytest.skip("this Triton's launch hooks are not a chain")
    launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    launcher("key", (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    assert [entry[0] for entry in launcher.kernel.launches] == ["triton", "triton", "direct"]


def test_compile_time_arguments_must_follow_the_runtime_ones(launcher):
    with pytest.raises(ValueError, match="compile-time arguments must follow"):
        launcher("key", (1,), ("x",), {"BLOCK": 64, "MODE": "a"}, {})  # `n` left out


def test_the_cache_is_bounded(launcher, monkeypatch):
    monkeypatch.setattr(DirectLauncher, "max_entries", 2)
    for key in range(5):
        launcher(key, (1,), ("x", 7), {"BLOCK": 64, "MODE": "a"}, {})
    assert len(launcher._compiled) <= 2


def test_tensor_facts_are_dtype_and_16_byte_alignment():
    t = torch.zeros(40, dtype=torch.bfloat16)
    assert tensor_facts(t, t[1:], t[8:].float()) == (
        (torch.bfloat16, True),
        (torch.bfloat16, False),
        (torch.float32, True),
    )
