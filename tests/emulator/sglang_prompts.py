"""Run in .venv-sglang (tests/sglang_env.run_sglang_script): SGLang 0.5.23's own prompt ids for
chat requests and text prompts, computed by its own code, not the emulator's.

    python tests/emulator/sglang_prompts.py IN.json OUT.json

IN.json: {"workers": [{"tokenizer": DIR, "chat_template": FILE | null}, ...], "chats": [body, ...],
"texts": [str, ...]}. Per worker, for each chat body: the request validated
by SGLang's ChatCompletionRequest, checked by OpenAIServingChat._validate_request and rendered
by _process_messages (its Jinja path: the same template manager, tokenizer loader and serving
class a worker builds); each text tokenized by TokenizerManager._tokenize_texts. OUT.json:
[{"chats": [{"ids": [...]} | {"status": 400|500, "error": str}, ...], "texts": [[...], ...]}, ...]
(one entry per worker).
Needs the CPU stand-ins (SMETRIC_SGLANG_CPU=1, their site dir on PYTHONPATH) to import SGLang
without torchvision.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any


def main(in_path: str, out_path: str) -> None:
    from sglang.srt.runtime_context import get_context

    get_context().override_server_args().install()  # SGLang's defaults for every server arg
    with open(in_path, encoding="utf-8") as f:
        given = json.load(f)
    out = [
        worker(w["tokenizer"], w["chat_template"], given["chats"], given["texts"])
        for w in given["workers"]
    ]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)
    print("RESULT " + json.dumps({"workers": len(out), "chats": len(given["chats"])}))


def worker(
    tokenizer_dir: str, chat_template: str | None, bodies: list[Any], texts: list[str]
) -> dict[str, Any]:
    import pydantic
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_dir)
    hf_config = types.SimpleNamespace(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    model_config = types.SimpleNamespace(
        hf_config=hf_config,
        is_multimodal=False,
        is_embedding_gemma=False,
        get_default_sampling_params=dict,
    )
    manager: Any = types.SimpleNamespace(
        tokenizer=tokenizer,
        processor=None,
        model_config=model_config,
        config_value=lambda name: None,
        server_args=None,
        served_model_name="golden",
    )
    templates = TemplateManager()
    templates.load_chat_template(manager, chat_template, "-")
    serving = OpenAIServingChat(manager, templates)

    tokenize: Any = object.__new__(TokenizerManager)
    tokenize.tokenizer = tokenizer
    tokenize.async_dynamic_batch_tokenizer = None
    tokenize.model_config = model_config

    chats: list[dict[str, Any]] = []
    for body in bodies:
        try:
            request = ChatCompletionRequest.model_validate(body)
        except pydantic.ValidationError as exc:
            chats.append({"status": 400, "error": f"validation: {exc.errors()[0]['msg']}"})
            continue
        problem = serving._validate_request(request)
        if problem:
            chats.append({"status": 400, "error": problem})
            continue
        try:
            result = serving._process_messages(request, False)
        except ValueError as exc:
            chats.append({"status": 400, "error": str(exc)})
        except Exception as exc:
            chats.append({"status": 500, "error": f"{type(exc).__name__}: {exc}"})
        else:
            chats.append({"ids": [int(i) for i in result.prompt_ids]})
    ids = [list(asyncio.run(tokenize._tokenize_texts(t))[0]) for t in texts]
    return {"chats": chats, "texts": ids}


if __name__ == "__main__":
    main(*sys.argv[1:3])
