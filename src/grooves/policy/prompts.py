"""Prompts as token ids: the model's own chat template, the family's tool format, token continuity.

Prompts are rendered with the model's own chat template (tools via the family's `ToolFormat`);
control-token text inside messages and tools stays text (`policy/control_tokens.py`).
For multi-turn agents, each completion the server returns is remembered with the exact token ids
of its prompt and its sample; when a later request continues that conversation, its prompt is
built from those ids plus the newly rendered suffix. The prompt then extends the earlier one
token for token, so the trainer can score the whole conversation as one sequence and never trains
on a re-tokenization that differs from what was sampled.

SFT renders its example chats through the same `template_text` and `encode`, so a chat trained
on with SFT tokenizes exactly as the sampler would have rendered it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from grooves.policy.control_tokens import ControlTextGuard
from grooves.policy.sampling import Completion
from grooves.policy.tool_calls import ToolCallCounters
from grooves.policy.tool_format import ParsedOutput, ToolFormat, tool_format_for

if TYPE_CHECKING:
    from grooves.policy.constraints import Constraint, GrammarCompiler

log = logging.getLogger("grooves.policy")


class ContextOverflow(ValueError):
    """The prompt plus max_tokens does not fit in the model's context."""


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def end_of_turn_ids(tokenizer, model) -> set[int]:
    """The tokens that end an assistant turn: the tokenizer's eos and the model's generation eos ids."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list):
        ids.update(extra)
    return {i for i in ids if i is not None}


class PromptState:
    """Renders chats to prompt ids and remembers the ids behind each completion it was told about."""

    def __init__(
        self,
        tokenizer,
        *,
        tool_format: str | None,
        max_context: int,
        eos_token_ids: set[int],
        max_records: int = 20_000,
        grammar_unavailable: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.tool_format: ToolFormat = tool_format_for(tool_format, tokenizer.chat_template, tokenizer)
        self.tool_calls = ToolCallCounters()
        """Calls read from sampled text, and call-like blocks kept as text because they did not parse."""
        self._grammars: GrammarCompiler | None = None
        """The grammar compiler for constrained decoding, built on first use (`constraint_for`)."""
        self.grammar_unavailable = grammar_unavailable
        """Why this policy's sampler cannot run a grammar (None: it can); a request that needs one is refused."""
        self.max_context = max_context
        self.eos_token_ids = eos_token_ids
        self.guard = ControlTextGuard(tokenizer)
        """Keeps `<|im_end|>` and other control-token text in messages and tools from becoming control tokens."""
        self._records: OrderedDict[str, tuple[list[int], list[int], str]] = OrderedDict()
        self._max_records = max_records

    def template_text(self, messages, tools, add_generation_prompt: bool) -> str:
        """The rendered prompt, with control-token text from the request marked (`encode` keeps it text)."""
        msgs, native_tools = self.tool_format.template_messages(messages, tools)
        return self.tokenizer.apply_chat_template(
            self.guard.mark(msgs),
            tools=self.guard.mark(native_tools),
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of text from `template_text`: marked control-token text as plain text."""
        return self.guard.encode(text)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the prompt, reusing the exact ids of earlier turns we sampled."""
        full = self.template_text(messages, tools, add_generation_prompt=True)
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].get("role") != "assistant":
                continue
            record = self._records.get(self._record_key(messages[: k + 1], tools))
            if record is None:
                continue
            prompt_ids, completion_ids, _ = record
            upto = self.template_text(messages[: k + 1], tools, add_generation_prompt=False)
            if full.startswith(upto) and completion_ids and completion_ids[-1] in self.eos_token_ids:
                # the template may write text after the end-of-turn token (SmolLM2: "\n"); the
                # sampled ids stop at that token, so the suffix starts right after it, not after `upto`
                eos_text = self.tokenizer.decode(completion_ids[-1:], skip_special_tokens=False)
                end = upto.rfind(eos_text)
                if end >= 0:
                    return prompt_ids + completion_ids + self.encode(full[end + len(eos_text) :])
            break
        return self.encode(full)

    @staticmethod
    def _normal_message(m: dict[str, Any]) -> dict[str, Any]:
        calls = [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in m.get("tool_calls") or []
        ]
        return {"role": m.get("role"), "content": m.get("content") or "", "tool_calls": calls}

    def _record_key(self, messages, tools) -> str:
        context = [self._normal_message(m) if m.get("role") == "assistant" else m for m in messages]
        return _key({"messages": context, "tools": tools})

    def remember(self, messages, tools, assistant_message, prompt_ids, completion: Completion) -> None:
        """Keep the token ids behind an assistant message we return, for later turns."""
        key = self._record_key([*messages, assistant_message], tools)
        self._records[key] = (prompt_ids, completion.token_ids, completion.text)
        self._records.move_to_end(key)
        while len(self._records) > self._max_records:
            self._records.popitem(last=False)

    def check_fits(self, prompt_ids: list[int], max_tokens: int) -> None:
        if len(prompt_ids) + max_tokens > self.max_context:
            raise ContextOverflow(
                f"prompt has {len(prompt_ids)} tokens and max_tokens is {max_tokens}: "
                f"together {len(prompt_ids) + max_tokens} > the model's context of {self.max_context}; "
                "shorten the messages or lower max_tokens"
            )

    def parse(self, text: str, tools, *, cut: bool = False) -> ParsedOutput:
        """Sampled text as an assistant message's content and OpenAI `tool_calls`; call-like blocks
        that do not parse stay in the content, counted (`tool_calls.unparsed`) and logged.

        `cut`: the text ended at max_tokens; a call it ends inside is returned with its arguments as
        far as written (or left out when its name was not whole), counted (`tool_calls.cut`) and logged.
        """
        syntax = self.tool_format.syntax
        parsed = syntax.parse_cut(text, tools) if cut else self.tool_format.parse(text, tools)
        self.tool_calls.parsed += len(parsed.tool_calls)
        self.tool_calls.unparsed += len(parsed.unparsed)
        for block in parsed.unparsed:
            log.warning("tool call kept as text (%s): %.200r", block.reason, block.text)
        if parsed.cut is not None:
            self.tool_calls.cut += 1
            log.warning("tool call cut at max_tokens (%s): %.200r", parsed.cut.describe(), parsed.cut.text)
        return parsed

    def constraint_for(
        self, *, response_format=None, tools=None, tool_choice=None, parallel_tool_calls: bool = True
    ) -> Constraint | None:
        """The grammar a request's `response_format` / `tool_choice` imposes on its samples, or None.

        Calls are forced in this model's own tool-call syntax. Raises `ConstraintError` (with the
        request field to name) for what cannot be compiled, or for any grammar when the policy's
        sampler cannot run one (`grammar_unavailable`).
        """
        from grooves.policy.constraints import ConstraintError, GrammarCompiler, request_grammar

        grammar = request_grammar(
            self.tool_format.syntax,
            response_format=response_format,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
        )
        if grammar is None:
            return None
        if self.grammar_unavailable is not None:
            field = grammar.param.split(".")[0]
            raise ConstraintError(
                f"{field} needs constrained decoding, which is not available here: {self.grammar_unavailable}; "
                "send it to a server with model.backend = 'transformers', or leave it out",
                field,
            )
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.eos_token_ids)
        return self._grammars.compile(grammar)
