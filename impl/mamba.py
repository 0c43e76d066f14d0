"""The Mamba (SSM) state pool, with copy-on-write and ping-pong track buffers.

Each slot holds one recurrent state: a convolution state and a temporal
(SSM) state, small configurable shapes. A request holds one state slot
(SGLang's ``mamba_pool_idx``) and, when track buffers are enabled,
``ping_pong_size`` more (``mamba_ping_pong_track_buffer``). Slots refine
:mod:`kvledger.spec.ledger`; a fingerprint column stands for the state's
contents so a copy or a use-after-free can be verified.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvledger.impl.arguments import check_id, check_int
from kvledger.impl.owners import encode
from kvledger.impl.slots import SlotPool
from kvledger.spec.errors import IntegrityError, InvalidArgument
from kvledger.spec.types import Owner


@dataclass(frozen=True)
class MambaAlloc:
    """What a request gets: one state slot and its track buffers (empty when disabled)."""

    state: int
    track: tuple[int, ...]

    def slots(self) -> tuple[int, ...]:
        return (self.state, *self.track)


class MambaPool:
    """``size`` Mamba state slots on ``device``."""

    def __init__(
        self,
        size: int,
        *,
        conv_shape: tuple[int, ...] = (4, 8),
        temporal_shape: tuple[int, ...] = (4, 8),
        ping_pong_size: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        check_int("create", "mamba", "ping_pong_size", ping_pong_size, 0, 1 << 20)
        check_int("create", "mamba", "size", size, 1, 1 << 24)
        for name, shape in (("conv_shape", conv_shape), ("temporal_shape", temporal_shape)):
            if not isinstance(shape, tuple) or any(type(d) is not int or not 0 < d < 1 << 63 for d in shape):
                raise InvalidArgument("create", "mamba", (), f"{name} must be a tuple of ints >= 1, got {shape!r:.40}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InvalidArgument("create", "mamba", (), f"dtype must be a floating torch.dtype, got {dtype!r:.40}")
        self.pool = SlotPool("mamba", size, device=device)
        self.device = self.pool.device
        self.ping_pong_size = ping_pong_size
        self.conv = torch.zeros((size, *conv_shape), dtype=dtype, device=self.device)
        self.temporal = torch.zeros((size, *temporal_shape), dtype=dtype, device=self.device)
        self.data = torch.zeros(size, dtype=torch.int64, device=self.device)

    def available_size(self) -> int:
        """Free state slots."""
        return self.pool.available_size()

    def alloc(self, n: int, owner: Owner) -> torch.Tensor:
        """``n`` state slots for ``owner``. Refines ``spec.ledger.allocate``."""
        return self.pool.alloc(n, owner)

    def alloc_request_state(self, owner: Owner) -> MambaAlloc:
        """A state slot plus ``ping_pong_size`` track buffers, all or nothing."""
        got = self.pool.alloc(1 + self.ping_pong_size, owner).tolist()
        return MambaAlloc(got[0], tuple(got[1:]))

    def free(self, indices: torch.Tensor, owner: Owner) -> None:
        """Return ``owner``'s slots. Refines ``spec.ledger.free``."""
        self.pool.free(indices, owner)

    def transfer(self, indices: torch.Tensor, src: Owner, dst: Owner) -> None:
        """Hand slots from ``src`` to ``dst``. Refines ``spec.ledger.transfer``."""
        self.pool.transfer(indices, src, dst)

    def copy_state(self, src: int, dst: int, owner: Owner) -> None:
        """Copy-on-write: copy slot ``src``'s state into ``owner``'s slot ``dst`` (another slot, held by ``owner``)."""
        s, d = self._idx("copy_state", src, "src"), self._idx("copy_state", dst, "dst")
        encode(owner, "copy_state", "mamba")
        self.pool.as_index("copy_state", torch.cat((s, d)))
        self.pool.check_held("copy_state", d, owner)
        if int(self.pool.owner_tag[s]) == 0:
            raise InvalidArgument("copy_state", "mamba", [src], "copy from a free slot (use after free)")
        self.conv[d] = self.conv[s]
        self.temporal[d] = self.temporal[s]
        self.data[d] = self.data[s]

    def write_fingerprint(self, slot: int, value: int) -> None:
        """Write a state whose contents are determined by ``value`` (the fingerprint of its prefix, an int >= 0)."""
        s = self._idx("write_fingerprint", slot)
        check_int("write_fingerprint", "mamba", "value", value, 0, 1 << 63)
        self.data[s] = value
        self.conv[s] = float(value % 1000)
        self.temporal[s] = float(value % 997)

    def verify(self, slot: int, value: int) -> None:
        """Raise ``IntegrityError`` unless ``slot`` holds the state written for ``value`` (its fingerprint and every
        value of its conv and temporal tensors)."""
        self._idx("verify", slot)
        check_int("verify", "mamba", "value", value, 0, 1 << 63)
        got = int(self.data[slot])
        off = torch.cat(((self.conv[slot] - value % 1000).flatten(), (self.temporal[slot] - value % 997).flatten()))
        if got != value or bool(off.any()):
            raise IntegrityError(f"mamba: slot {slot} should hold state {value} but holds {got} (use after free?)")

    def _idx(self, op: str, slot: int, name: str = "slot") -> torch.Tensor:
        check_id(op, "mamba", name, slot, 0, self.pool.size)
        return torch.tensor([slot], dtype=torch.int64, device=self.device)
