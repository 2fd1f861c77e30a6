"""The tokenizer endpoints: POST /tokenize and /detokenize, and GET /tokenizer_info (only with
--enable-tokenizer-info-endpoint)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vllm_sim import text
from vllm_sim.protocol import ApiError, body_error, messages_text
from vllm_sim.server.state import ServerState, _json


class TokenizerRoutes(ServerState):
    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        if body.get("model") is not None and body["model"] not in self.served_names:
            raise ApiError(404, "NotFoundError", f"The model `{body['model']}` does not exist.", "model")
        tok = self.limits.tokenizer
        if "messages" in body:
            messages, add_gen = messages_text(body)
            rendered = text.render_chat(messages, add_gen)
            ids = tok.encode_rendered(rendered)
            strs = tok.pieces(rendered, add_special_tokens=False) if body.get("return_token_strs") else None
        elif isinstance(body.get("prompt"), str):
            special = bool(body.get("add_special_tokens", True))
            ids = tok.encode_prompt(body["prompt"], add_special_tokens=special)
            strs = (
                tok.pieces(body["prompt"], add_special_tokens=special)
                if body.get("return_token_strs")
                else None
            )
        else:
            raise body_error("missing", "prompt", "Field required", body)
        return _json(
            {"count": len(ids), "max_model_len": self.shape.max_model_len, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise body_error("list_type", "tokens", "Input should be a valid list", tokens)
        return _json({"prompt": self.limits.tokenizer.decode(tokens)})

    async def tokenizer_info(self, request: web.Request) -> web.Response:
        # tokenize/api_router.py:86-99 (only with --enable-tokenizer-info-endpoint): TokenizerInfo
        # (tokenize/serving.py:163-184) answers the tokenizer's init kwargs (its tokenizer_config.json, file
        # paths removed) plus `tokenizer_class`, and `chat_template` only when --chat-template was given.
        # The simulator reports the few keys of a Llama-3 tokenizer config that its tokenizer models.
        info: dict[str, Any] = {
            "bos_token": text.BOS,
            "eos_token": "<|eot_id|>",
            "model_max_length": self.shape.profile.model.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        return _json(info)
