"""What the application answers an ``assistant-request`` with: the call's assistant (``AssistantConfig``), or that
the call be refused. One pydantic schema for the webhook's JSON and the Python hook's return
value (``AssistantReply.model_json_schema()``, published as ``docs/application-schema.json``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["AssistantConfig", "AssistantReply"]


class AssistantConfig(BaseModel):
    """The call's assistant. A field left out keeps the bridge's configured value (``[engine]``, ``[app]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instructions: str | None = Field(default=None, max_length=32_768)
    """The model's instructions for this call (the system prompt)."""
    voice: str | None = Field(default=None, max_length=128)
    temperature: float | None = Field(default=None, ge=0, le=2)
    greeting: str | None = Field(default=None, max_length=4096)
    """The agent speaks first: what the model is told as the call starts, a text turn it answers at once (write
    it as an instruction, "Greet the caller and ask how you can help"); ``""``: it waits for the caller."""


class AssistantReply(BaseModel):
    """The answer to an ``assistant-request``: exactly one of ``assistant`` (answer the call with it) or ``reject``
    (refuse it: ``busy``, or ``hang_up``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    assistant: AssistantConfig | None = None
    reject: Literal["busy", "hang_up"] | None = None

    @model_validator(mode="after")
    def _one_answer(self) -> AssistantReply:
        given = [name for name in ("assistant", "reject") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of assistant, reject (given: {', '.join(given) or 'none'})")
        return self

    @classmethod
    def answer(cls, assistant: AssistantConfig | None = None) -> AssistantReply:
        return cls(assistant=assistant or AssistantConfig())
