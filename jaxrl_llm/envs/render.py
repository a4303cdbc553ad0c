"""The token ids of an episode, token in and token out: what the policy trains on is exactly what the
sampler was fed and what it sampled.

An episode's ids are, in order: the opening prompt (the opening messages rendered with the generation
prompt), then each assistant turn's ids as sampled, each followed by the ids of the observation after
it. Sampled ids are appended verbatim, never decoded and re-encoded: a decode/encode round trip can
give other ids than the sampled ones (a word sampled as two tokens comes back as one), and then the
trainer would score tokens the policy never sampled. Only what the environment adds is tokenised,
once, when it is added; the rollout loop feeds the same ids to the sampler.

Two renderers:
- `ChatRenderer`: through the tokenizer's chat template. The observation after a turn is a delta of
  two renderings of the conversation (the turns as text), without and with the new messages:
      close  = what the template writes after a turn's content, less the EOS the turn sampled
               ("<|im_end|>\\n" less "<|im_end|>" = "\\n" in ChatML);
      delta  = render(history + turn + new, generation prompt) minus render(history + turn);
      ids    = encode(close + delta), tokenised once.
  The turn's text is a placeholder character in these renderings, so the close does not depend on
  what was sampled. A turn that called tools is instead the structured message the environment
  parsed from it (`tool_calls` with their ids, calls.py's `assistant_message`; the tool messages
  carry each call's `tool_call_id`), as the family's template expects its history: the close is then
  what the template writes after its last end-of-turn token (an id of `eos_ids`) in that turn,
  e.g. "\\n" after Qwen's "<|im_end|>", "" after Llama's "<|eot_id|>" or GPT-OSS's "<|call|>".
  A template that rewrites earlier text when messages are added (Qwen3's drops the thinking of
  earlier turns) has no such delta: that is an error naming the first changed character,
  never a silent re-tokenisation. For a template that is prefix-stable and a turn sampled as its
  canonical tokenisation, the ids equal transformers' `apply_chat_template(conversation,
  tokenize=True)` (tests/envs/test_env_render.py checks SmolLM2's and Qwen2.5's templates,
  tests/envs/test_call_formats.py templates of the Llama 3.1, Mistral, GPT-OSS and Qwen families).
  A turn cut before its EOS gets the template's whole close (e.g. "<|im_end|>\\n") as observation ids.
- `PlainRenderer`: no template, for base models: the opening prompt is the messages' contents
  concatenated (after BOS when the tokenizer has one), an observation its messages' contents.

Each token carries two labels: sampled by the policy (`policy_T`: the loss's tokens) and its turn
(`turn_T`): turn k's sampled tokens carry k, and the tokens the environment adds before turn k carry
k too (the opening prompt 0), so `turn_T` never decreases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

# Stands for a turn's content in the renderings that find the template's close: a private-use
# character, which no template tests for and no tokenizer sees.
_PLACEHOLDER = "\ue000"


class TemplateDeltaError(ValueError):
  """The chat template cannot append messages without rewriting what it rendered before them."""


@dataclasses.dataclass(frozen=True)
class RenderedEpisode:
  """The ids an episode trains on, with each token's labels."""

  ids_T: np.ndarray  # int32 [T], opening prompt, then each turn and the observation after it
  policy_T: np.ndarray  # bool [T], sampled by the policy (the tokens the loss sees)
  turn_T: np.ndarray  # int32 [T], the turn a token belongs to or comes before (0 for the opening prompt)
  prompt_len: int  # P: ids_T[:P] is the opening prompt, ids_T[P:] the response (R = T - P tokens)


class Renderer(Protocol):
  """Turns messages into ids (ChatRenderer, PlainRenderer)."""

  def opening_ids(self, messages: Sequence[dict]) -> list[int]:
    """The opening prompt: `messages` rendered up to where the first turn starts."""
    ...

  def turn_message(self, ids: Sequence[int]) -> dict:
    """The assistant message a turn's ids stand for in later renderings (its text)."""
    ...

  def observation_ids(self, history: Sequence[dict], turn_ids: Sequence[int],
                      messages: Sequence[dict], assistant: dict | None = None) -> list[int]:
    """The ids after the turn `turn_ids` that bring in `messages`, up to where the next turn starts.
    `history`: the conversation before that turn (opening messages, earlier turns, earlier
    observations); `assistant`: the turn as a structured message (its tool calls), None: its text."""
    ...


def _diverges(longer: str, prefix: str) -> str:
  """Where `longer` stops starting with `prefix`, for errors."""
  i = next((i for i, (a, b) in enumerate(zip(longer, prefix)) if a != b), min(len(longer), len(prefix)))
  return f"at character {i}: {prefix[max(0, i - 30):i + 30]!r} became {longer[max(0, i - 30):i + 30]!r}"


class ChatRenderer:
  """Renders through the tokenizer's chat template (model/tokenizer.py's HFTokenizer).

  template_vars: passed to every rendering (e.g. `tools=[tool.schema(), ...]` for a template that
  writes them into its system prompt); the same in every rendering, so the deltas stay consistent.
  """

  def __init__(self, tokenizer, **template_vars):
    if getattr(tokenizer, "chat_template", None) is None:
      raise ValueError("ChatRenderer: the tokenizer has no chat template; use PlainRenderer for a base model")
    self.tokenizer, self.template_vars = tokenizer, template_vars

  def _render(self, messages: Sequence[dict], generation_prompt: bool) -> str:
    return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt,
                                              **self.template_vars)

  def opening_ids(self, messages: Sequence[dict]) -> list[int]:
    return self.tokenizer.encode(self._render(messages, True))

  def _ends_turn(self, ids: Sequence[int]) -> bool:
    return bool(ids) and int(ids[-1]) in self.tokenizer.eos_ids

  def turn_message(self, ids: Sequence[int]) -> dict:
    body = list(ids[:-1]) if self._ends_turn(ids) else list(ids)
    return {"role": "assistant", "content": self.tokenizer.decode(body, skip_special_tokens=False)}

  def _close(self, rendered_turn: str, turn_ids: Sequence[int], structured: bool, n_history: int) -> str:
    """What the template writes after the sampled turn whose rendering (after its generation prompt)
    is `rendered_turn`, less the EOS the turn sampled."""
    if not structured:
      if _PLACEHOLDER not in rendered_turn:
        raise TemplateDeltaError(f"the chat template drops an assistant turn's content after {n_history} "
                                 f"messages: {rendered_turn[:80]!r}")
      close = rendered_turn.split(_PLACEHOLDER, 1)[1]
      if self._ends_turn(turn_ids):
        close = close.removeprefix(self.tokenizer.decode([int(turn_ids[-1])], skip_special_tokens=False))
      return close
    sampled = self.tokenizer.decode([int(i) for i in turn_ids], skip_special_tokens=False)
    if not self._ends_turn(turn_ids):  # no EOS sampled: the turn must be the template's text of it
      if not rendered_turn.startswith(sampled):
        raise TemplateDeltaError(f"a tool-call turn without EOS, {sampled[-40:]!r}, is not the chat template's "
                                 f"text of it, {rendered_turn[:80]!r}: its close is unknown")
      return rendered_turn[len(sampled):]
    ends = {self.tokenizer.decode([e], skip_special_tokens=False) for e in self.tokenizer.eos_ids}
    at = max(((rendered_turn.rfind(e), e) for e in ends if e), default=(-1, ""))
    if at[0] == -1:
      raise TemplateDeltaError(f"the chat template ends a tool-call turn with none of the EOS tokens "
                               f"{sorted(ends)}: {rendered_turn[-80:]!r}")
    return rendered_turn[at[0] + len(at[1]):]

  def observation_ids(self, history: Sequence[dict], turn_ids: Sequence[int],
                      messages: Sequence[dict], assistant: dict | None = None) -> list[int]:
    history = list(history)
    prompt = self._render(history, True)
    turn = assistant if assistant is not None else {"role": "assistant", "content": _PLACEHOLDER}
    with_turn = self._render(history + [turn], False)
    if not with_turn.startswith(prompt):
      raise TemplateDeltaError(
          f"the chat template is not prefix-stable: an assistant turn after {len(history)} messages is not "
          f"rendered where its generation prompt ends ({_diverges(with_turn, prompt)}); token-in/token-out "
          "rendering needs the turn's text to continue the generation prompt")
    close = self._close(with_turn[len(prompt):], turn_ids, assistant is not None, len(history))
    after = self._render(history + [turn] + list(messages), True)
    if not after.startswith(with_turn):
      raise TemplateDeltaError(
          f"the chat template rewrites the conversation when {len(messages)} message(s) follow turn "
          f"{sum(m.get('role') == 'assistant' for m in history)} ({_diverges(after, with_turn)}); it is not "
          "prefix-stable, so an observation has no delta of its own")
    return self.tokenizer.encode(close + after[len(with_turn):])


class PlainRenderer:
  """No chat template (a base model): messages' contents as plain text.

  bos: start the opening prompt with the tokenizer's BOS when it has one (as the prompt pipeline does
  without a chat template).
  """

  def __init__(self, tokenizer, *, bos: bool = True):
    self.tokenizer, self.bos = tokenizer, bos

  def opening_ids(self, messages: Sequence[dict]) -> list[int]:
    bos = getattr(self.tokenizer, "bos_id", None)
    head = [bos] if self.bos and bos is not None else []
    return head + list(self.tokenizer.encode("".join(m["content"] for m in messages)))

  def turn_message(self, ids: Sequence[int]) -> dict:
    return {"role": "assistant", "content": self.tokenizer.decode(list(ids))}

  def observation_ids(self, history: Sequence[dict], turn_ids: Sequence[int],
                      messages: Sequence[dict], assistant: dict | None = None) -> list[int]:
    del history, turn_ids, assistant  # plain text: what comes next does not depend on them
    return list(self.tokenizer.encode("".join(m["content"] for m in messages)))


class TokenTrace:
  """The ids of one episode as it grows: the opening prompt, then turns and observations in turn.

  The rollout loop feeds `ids` to the sampler, appends what it sampled with `add_turn`, and the
  environment's answer with `add_observation`; `rendered()` is what the trainer gets.
  """

  def __init__(self, renderer: Renderer, opening: Sequence[dict]):
    self.renderer = renderer
    self.history = [dict(m) for m in opening]  # the conversation so far, for templates (turns as text or calls)
    ids = [int(i) for i in renderer.opening_ids(self.history)]
    self._ids, self._policy, self._turn = ids, [False] * len(ids), [0] * len(ids)
    self.prompt_len = len(ids)
    self.n_turns = 0
    self._last_turn: list[int] | None = None  # a turn with no observation after it yet

  def __len__(self) -> int:
    return len(self._ids)

  @property
  def ids(self) -> list[int]:
    """The episode's ids so far (a copy): what the sampler continues from."""
    return list(self._ids)

  def add_turn(self, ids: Sequence[int]) -> None:
    """Appends a turn's ids exactly as sampled."""
    if self._last_turn is not None:
      raise ValueError("TokenTrace.add_turn: the previous turn has no observation yet (add_observation)")
    ids = [int(i) for i in ids]
    self._ids += ids
    self._policy += [True] * len(ids)
    self._turn += [self.n_turns] * len(ids)
    self._last_turn = ids
    self.n_turns += 1

  def observation_ids(self, messages: Sequence[dict], assistant: dict | None = None) -> list[int]:
    """The ids `add_observation(messages, assistant=assistant)` would append (nothing is appended)."""
    if self._last_turn is None:
      raise ValueError("TokenTrace.observation_ids: no turn to follow (add_turn first)")
    return [int(i) for i in self.renderer.observation_ids(self.history, self._last_turn, messages, assistant)]

  def add_observation(self, messages: Sequence[dict], ids: Sequence[int] | None = None,
                      assistant: dict | None = None) -> list[int]:
    """Appends the observation after the last turn; returns its ids. `ids`: those observation_ids
    returned for the same messages, to save rendering twice. `assistant`: the last turn as a structured
    message (its tool calls) in the history; None: its text."""
    ids = self.observation_ids(messages, assistant) if ids is None else [int(i) for i in ids]
    self._ids += ids
    self._policy += [False] * len(ids)
    self._turn += [self.n_turns] * len(ids)
    turn = dict(assistant) if assistant is not None else self.renderer.turn_message(self._last_turn)
    self.history += [turn, *(dict(m) for m in messages)]
    self._last_turn = None
    return ids

  def rendered(self) -> RenderedEpisode:
    return RenderedEpisode(ids_T=np.asarray(self._ids, np.int32), policy_T=np.asarray(self._policy, bool),
                           turn_T=np.asarray(self._turn, np.int32), prompt_len=self.prompt_len)


def render_episode(renderer: Renderer, opening: Sequence[dict],
                   steps: Sequence[tuple[Sequence[int], Sequence[dict]]]) -> RenderedEpisode:
  """A finished episode's ids and labels: `opening` messages, then (turn ids as sampled, the messages
  observed after that turn) per turn; the last turn's messages are () when the episode ended there."""
  trace = TokenTrace(renderer, opening)
  for i, (turn_ids, messages) in enumerate(steps):
    trace.add_turn(turn_ids)
    if messages:
      trace.add_observation(messages)
    elif i != len(steps) - 1:
      raise ValueError(f"render_episode: turn {i} has no observation after it, but turn {i + 1} follows")
  return trace.rendered()
