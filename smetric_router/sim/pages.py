"""Trace block ids -> engine page hashes, so the simulator never hashes tokens.

A trace block of `block_size` tokens is `block_size / page_size` engine pages. Block ids are
prefix-chained content ids, so a block is identified by the chain of ids up to it; page j of a
block gets the chain's hash XOR a fixed offset for j. Equal id chains therefore give equal pages,
as equal token prefixes give equal SGLang page hashes. Python's hash of int tuples is deterministic
(PYTHONHASHSEED only salts str/bytes), and 64-bit collisions are ignored as SGLang's are.

Outputs: a request's output pages (and the page straddling prompt end and output start) get
hashes unique to the request. They occupy cache like real outputs, but a later turn reuses them
only through its own block ids: the trace says what the next prompt contains, and the simulator
does not guess that it contains the previous output.

A follow-up mostly re-sends its session's previous prompt, so the pages of the blocks it shares
with the previous request of its session are copied from that request's pages, not re-hashed.
"""

from __future__ import annotations

from collections import OrderedDict

from smetric_router.traces.schema import TraceRequest

_OUTPUT_TAG = -0x5EED  # keeps output page keys apart from block chain keys
_PAGE_TAG = -0xB10C
# sessions whose last pages are kept for reuse; a follow-up comes within a few hundred requests
# of its predecessor, and the bound keeps memory flat over long traces
_SESSIONS_KEPT = 2048


class PageMapper:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._offset_cache: dict[int, list[int]] = {}
        # session -> (block ids, pages, how many leading pages derive from the block ids)
        self._last: OrderedDict[str, tuple[tuple[int, ...], list[int], int]] = OrderedDict()

    def _offsets(self, per_block: int) -> list[int]:
        """Page j of a block is (block chain hash) XOR a fixed pseudo-random 64-bit offset."""
        got = self._offset_cache.get(per_block)
        if got is None:
            got = [0] + [hash((_PAGE_TAG, j)) for j in range(1, per_block)]
            self._offset_cache[per_block] = got
        return got

    def pages(self, req: TraceRequest, serial: int) -> list[int]:
        """Hashes of every full page of prompt + output (EngineRequest.page_hashes). The mapper
        keeps the list for the session's next request: callers must not mutate it."""
        ps = self.page_size
        bs = req.block_size
        if bs % ps:
            raise ValueError(f"block size {bs} is not a multiple of the page size {ps}")
        per_block = bs // ps
        offsets = self._offsets(per_block)
        n_prompt = req.input_len // ps
        n_total = (req.input_len + max(req.output_len, 1)) // ps
        ids = req.block_ids
        out: list[int] = []
        chain = 0
        reused = 0
        last = self._last.pop(req.session, None)
        if last is not None:
            prev_ids, prev_pages, prev_derived = last
            whole = min(len(prev_ids), prev_derived // per_block, len(ids))
            while reused < whole and prev_ids[reused] == ids[reused]:
                reused += 1
            if reused:
                out = prev_pages[: reused * per_block]
                chain = out[-per_block]  # page 0 of a block is its chain hash (offset 0)
        if per_block == 1:  # a block is a page (the generator's 16-token blocks)
            for block in ids[reused : reused + n_prompt - len(out)]:
                chain = hash((chain, block))
                out.append(chain)
        else:
            for block in ids[reused:]:
                if len(out) >= n_prompt:
                    break
                chain = hash((chain, block))
                out.extend([chain ^ o for o in offsets])
        del out[n_prompt:]
        derived = len(out)
        # a prompt longer than its block ids cover gets request-private pages for the rest
        out.extend(hash((_OUTPUT_TAG, serial, j)) for j in range(len(out), n_total))
        self._last[req.session] = (ids, out, derived)
        if len(self._last) > _SESSIONS_KEPT:
            self._last.popitem(last=False)
        return out
