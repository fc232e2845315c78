"""Which of a prompt's pages are in the Mooncake store, asked as a separate pure client would.

argv[1]: JSON {"master": "H:P", "metadata": URL, "prefix": SGLang's config prefix (the served
model name), "token_ids": [...], "page_size": N}. Keys are SGLang's own (MooncakeStore, MHA, TP
rank 0): `<prefix>_<get_hash_str page hash>_0_k` / `_v`.
Prints RESULT {"keys": [...], "exist": [...]}.
"""

import json
import sys

from mooncake.store import MooncakeDistributedStore
from sglang.srt.mem_cache.utils import get_hash_str

args = json.loads(sys.argv[1])
ids, page = args["token_ids"], args["page_size"]
hashes = get_hash_str(ids[: len(ids) // page * page], None, page_size=page)
assert isinstance(hashes, list)
keys = [f"{args['prefix']}_{h}_0_{kv}" for h in hashes for kv in ("k", "v")]
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", args["metadata"], 0, 16 << 20, "tcp", "", args["master"])
assert rc == 0, f"setup: {rc}"
print("RESULT " + json.dumps({"keys": keys, "exist": list(store.batch_is_exist(keys))}), flush=True)
