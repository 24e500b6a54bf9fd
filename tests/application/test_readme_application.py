"""The README's application (section "Your application") is real code: it loads as ``app.module`` does and
answers as it says."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from callbridge.application import AssistantConfig, CallContext
from callbridge.application.hooks import load_module

pytestmark = pytest.mark.core

README = Path(__file__).resolve().parents[2] / "README.md"


async def test_the_readme_application_loads_and_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = re.findall(r"```python\n(# myagent\.py.*?)```", README.read_text(), flags=re.S)
    (tmp_path / "myagent.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "myagent", raising=False)
    app = load_module("myagent:app").target
    chosen = await app.assistant(CallContext(call_id="CA1", carrier="twilio", caller_number="+15005550006"))
    assert isinstance(chosen, AssistantConfig) and chosen.recording and chosen.greeting == "Greet Ada by name and ask how you can help."
    assert json.loads(await app.tool(CallContext(call_id="CA1", carrier="twilio"), "look_up_order", {}))["order"] == "A-17"
    assert len(code.strip().splitlines()) <= 32  # the "30-line application" of issue 18
