"""``/v1/models`` and runtime LoRA loading with vLLM's bodies, messages and status codes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mcprl_common.errors import BadRequestError, NotFoundError
from mcprl_inference.api import (
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    UnloadLoRAAdapterRequest,
)
from mcprl_inference.engine import LLMEngine
from mcprl_inference.engine.lora import LoraError


class ServingModels:
    """The base model's name and the adapters loaded on top of it."""

    def __init__(self, engine: LLMEngine, base_name: str, base_root: str,
                 on_load: Callable[[str], None] | None = None,
                 strict_reload: bool = False) -> None:
        self.engine = engine
        self.strict_reload = strict_reload
        self.on_load = on_load
        self.base_name = base_name
        self.base_root = base_root
        self._lock = asyncio.Lock()

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request's ``model`` names (``None``: the base model); 404 otherwise."""

        if model is None or model == self.base_name:
            return None
        if model in self.engine.lora.adapters:
            return model
        raise NotFoundError(f"The model `{model}` does not exist.", param="model")

    def list(self) -> ModelList:
        cards = [ModelCard(id=self.base_name, root=self.base_root,
                           max_model_len=self.engine.max_model_len)]
        for adapter in list(self.engine.lora.adapters.values()):
            cards.append(ModelCard(id=adapter.name, root=adapter.path, parent=self.base_name))
        return ModelList(data=cards)

    async def load_lora(self, req: LoadLoRAAdapterRequest) -> str:
        if not req.lora_name or not req.lora_path:
            raise BadRequestError("Both 'lora_name' and 'lora_path' must be provided.")
        if req.lora_name == self.base_name:
            raise BadRequestError(f"'{req.lora_name}' is the base model's name; pick another "
                                  "lora_name.", param="lora_name")
        if (self.strict_reload and not req.load_inplace
                and req.lora_name in self.engine.lora.adapters):
            raise BadRequestError(f"The lora adapter '{req.lora_name}' has already been loaded. "
                                  "If you want to load the adapter in place, set 'load_inplace'"
                                  " to True.")
        async with self._lock:  # one model change at a time, in arrival order
            try:
                await asyncio.wrap_future(self.engine.load_lora(req.lora_name, req.lora_path))
            except LoraError as exc:
                cls = NotFoundError if exc.not_found else BadRequestError
                raise cls(str(exc), param="lora_path") from exc
        if self.on_load is not None:
            self.on_load(req.lora_name)
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."

    async def unload_lora(self, req: UnloadLoRAAdapterRequest) -> str:
        if not req.lora_name:
            raise BadRequestError("either 'lora_name' and 'lora_int_id' needs to be provided.")
        async with self._lock:
            try:
                await asyncio.wrap_future(self.engine.unload_lora(req.lora_name))
            except LoraError as exc:
                raise NotFoundError(str(exc), param="lora_name") from exc
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."
