"""Train the small byte-level BPE tokenizer committed under smetric_router/assets/tokenizer/.

The corpus is generated here from a fixed seed (English-ish prose, code and JSON), so the tokenizer
is reproducible offline: `python -m smetric_router.features.make_tokenizer --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 8192
SEED = 20240917
N_DOCS = 6000

# The bundled tokenizer's chat template: ChatML, content parts rendered as their text.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is iterable %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _split(text: str) -> list[str]:
    return text.split()


_COMMON = _split(
    "the of and to a in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think "
    "say help low line differ turn cause much mean before move right boy old too same tell "
    "does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need "
    "house picture try us again animal point mother world near build self earth father head "
    "stand own page should country found answer school grow study still learn plant cover "
    "food sun four between state keep eye never last let thought city tree cross farm hard "
    "start might story saw far sea draw left late run while press close night real life few "
    "north open seem together next white children begin got walk example ease paper group "
    "always music those both mark often letter until mile river car feet care second book "
    "carry took science eat room friend began idea fish mountain stop once base hear horse "
    "cut sure watch color face wood main enough plain girl usual young ready above ever red "
    "list though feel talk bird soon body dog family direct pose leave song measure door "
    "product black short numeral class wind question happen complete ship area half rock "
    "order fire south problem piece told knew pass since top whole king space heard best hour "
    "better true during hundred five remember step early hold west ground interest reach fast "
    "verb sing listen six table travel less morning ten simple several vowel toward war lay "
    "against pattern slow center love person money serve appear road map rain rule govern "
    "pull cold notice voice unit power town fine certain fly fall lead cry dark machine note "
    "wait plan figure star box noun field rest correct able pound done beauty drive stood "
    "contain front teach week final gave green quick develop ocean warm free minute strong "
    "special mind behind clear tail produce fact street inch request response model server "
    "cache token router worker session agent tool call result error file function return "
    "value string list data user system assistant message content prompt query search"
)

_KEYWORDS = _split(
    "def class return if elif else for while in import from as with try except finally raise "
    "yield lambda None True False self async await pass break continue not and or is const "
    "let var function struct impl fn pub use mod match enum trait int float str bool dict "
    "list tuple void char"
)

_SYLLABLES = _split(
    "ba be bi bo bu ca ce ci co cu da de di do du fa fe fi fo ga ge go ha he hi ho ka ke ki "
    "ko la le li lo lu ma me mi mo mu na ne ni no nu pa pe pi po pu ra re ri ro ru sa se si "
    "so su ta te ti to tu va ve vi vo wa we wi ya yo za ze ar er ir or ur an en in on un al "
    "el il ol ul st tr pr th sh ch ng nd nt ck ll ss tion ment ing ed ly er est ous able ive "
    "ful"
)


def _pseudo_words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def _zipf_pick(rng: random.Random, words: list[str]) -> str:
    # Rank r is drawn with weight ~1/r, so frequent words become single tokens.
    return words[min(int(len(words) ** rng.random()) - 1, len(words) - 1)]


def _prose(rng: random.Random, words: list[str]) -> str:
    sentences = []
    for _ in range(rng.randint(2, 8)):
        ws = [_zipf_pick(rng, words) for _ in range(rng.randint(4, 18))]
        ws[0] = ws[0].capitalize()
        sentences.append(" ".join(ws) + rng.choice([".", ".", ".", "?", "!", ":", ";"]))
    return " ".join(sentences)


def _ident(rng: random.Random, words: list[str]) -> str:
    parts = [_zipf_pick(rng, words) for _ in range(rng.randint(1, 3))]
    return rng.choice(["_".join(parts), parts[0] + "".join(p.capitalize() for p in parts[1:])])


def _code(rng: random.Random, words: list[str]) -> str:
    lines = []
    indent = 0
    for _ in range(rng.randint(4, 20)):
        kind = rng.random()
        name = _ident(rng, words)
        if kind < 0.2:
            args = ", ".join(_ident(rng, words) for _ in range(rng.randint(0, 3)))
            lines.append(
                "    " * indent + f"{rng.choice(['def', 'async def', 'fn'])} {name}({args}):"
            )
            indent = min(indent + 1, 3)
        elif kind < 0.5:
            value = rng.choice(
                [
                    str(rng.randint(0, 10 ** rng.randint(1, 6))),
                    f'"{_ident(rng, words)}"',
                    "None",
                    "[]",
                ]
            )
            lines.append("    " * indent + f"{name} = {value}")
        elif kind < 0.7:
            other = _ident(rng, words)
            op = rng.choice(["+", "-", "*", "==", "!=", "<=", ">=", "and", "or"])
            lines.append("    " * indent + f"{rng.choice(_KEYWORDS)} {name} {op} {other}")
        elif kind < 0.85:
            lines.append("    " * indent + f"return {name}.{_ident(rng, words)}()")
            indent = max(indent - 1, 0)
        else:
            lines.append("    " * indent + f"# {_prose(rng, words)[:60]}")
    return "\n".join(lines) + "\n"


def _json(rng: random.Random, words: list[str]) -> str:
    obj = {
        _ident(rng, words): rng.choice(
            [rng.randint(0, 99999), _prose(rng, words)[:40], True, None, [1, 2, 3]]
        )
        for _ in range(rng.randint(1, 6))
    }
    return json.dumps(obj, indent=rng.choice([None, 2]))


def corpus(seed: int = SEED, n_docs: int = N_DOCS) -> Iterator[str]:
    rng = random.Random(seed)
    words = _COMMON + _KEYWORDS + _pseudo_words(rng, 3000)
    makers = (_prose, _prose, _code, _json)
    for _ in range(n_docs):
        yield rng.choice(makers)(rng, words)


def train(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def tokenizer_config(tok: Tokenizer) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1048576,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="directory to write tokenizer.json into")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train()
    tok.save(str(out / "tokenizer.json"))
    config = json.dumps(tokenizer_config(tok), indent=2, ensure_ascii=False)
    (out / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
