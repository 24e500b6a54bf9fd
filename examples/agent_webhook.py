"""The application of ``examples/agent.py`` as a webhook: ``uvicorn examples.agent_webhook:api --port 9000``, then
``callbridge serve --set app.webhook_url=http://127.0.0.1:9000/callbridge --set app.webhook_secret=$SECRET``
(and ``CALLBRIDGE_APP_SECRET=$SECRET`` here). Any language can do the same: the schema is
``docs/application-schema.json``; check the ``Callbridge-Signature`` header as ``verify_signature`` does."""

from __future__ import annotations

import os

from fastapi import FastAPI, Request, Response

from callbridge.application import (
    SIGNATURE_HEADER,
    AssistantConfig,
    AssistantReply,
    CallContext,
    ToolResult,
    verify_signature,
)
from callbridge.application.events import CallEvent
from examples.agent import Agent

api = FastAPI()
agent = Agent()


@api.post("/callbridge")
async def callbridge(request: Request) -> Response:
    body = await request.body()
    if not verify_signature(os.environ["CALLBRIDGE_APP_SECRET"], request.headers.get(SIGNATURE_HEADER), body):
        return Response(status_code=401)
    message = await request.json()
    call = CallContext.model_validate(message["call"])
    match message["type"]:
        case "assistant-request":
            reply = await agent.assistant(call)
            if isinstance(reply, AssistantConfig):
                reply = AssistantReply.answer(reply)
            return Response(reply.model_dump_json(exclude_none=True), media_type="application/json")
        case "tool-call":
            result = ToolResult(output=await agent.tool(call, message["name"], message["arguments"]))
            return Response(result.model_dump_json(exclude_none=True), media_type="application/json")
        case "call-event":
            await agent.event(call, CallEvent.model_validate(message["event"]))
    return Response(status_code=204)
