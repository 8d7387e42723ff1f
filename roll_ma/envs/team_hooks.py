"""Per-agent prompt hooks (``agents[i].process``): how each agent of a team builds its own prompt.

A hook file (``path/to/file.py``, or a dotted module) defines one or both of::

    def pre_process(tokenizer, prompt_ids, obs_ids, **pre_process_kwargs) -> list[int]
        # prompt_ids: the team context so far (what the agents before this one left, [] at the start)
        # obs_ids: the env's observation as token ids ([] when the agent has obs_with_env: false)
        # returns: the prompt this agent generates from
    def post_process(tokenizer, prompt_ids, response_ids, **post_process_kwargs) -> list[int]
        # prompt_ids: the team context before this agent spoke; response_ids: what it generated
        # returns: the team context the next agent reads

with the keyword arguments from the agent's config. A missing one keeps the default: the prompt is
the chat template of (system prompt, observation + context), the context grows by the response.
A hook that raises, returns anything but a list of token ids, or returns an id outside the tokenizer's
vocabulary stops the run with ``HookError`` naming the agent, the file and line, the function and the
value; a missing file or function is refused when the config is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roll_ma.errors import UserCodeError

HOOK_NAMES = ("pre_process", "post_process")
RETURNS = {"pre_process": "the prompt this agent generates from", "post_process": "the team context the next "
           "agent reads"}


class HookError(UserCodeError):
    """A hook raised, or returned something that is not a list of token ids of the tokenizer's vocabulary."""


def default_pre_process(tokenizer: Any, prompt_ids: list[int], obs_ids: list[int],
                        system_prompt: str | None = None) -> list[int]:
    """The chat template of (system prompt, observation + team context as text), generation prompt added."""
    from roll_ma.envs.prompts import chat_prompt_ids

    text = tokenizer.decode(obs_ids) + tokenizer.decode(prompt_ids)
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
    return chat_prompt_ids(tokenizer, messages + [{"role": "user", "content": text}])


def default_post_process(tokenizer: Any, prompt_ids: list[int], response_ids: list[int]) -> list[int]:
    """The team context with this agent's response appended."""
    return list(prompt_ids) + list(response_ids)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _token_ids(value: Any) -> list[int] | None:
    """``value`` as a list of ints (a list, tuple, 1-D tensor or array of them), else None."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(type(t) is int for t in value):
        return list(value)
    return None


@dataclass
class AgentHooks:
    """One agent's prompt hooks, loaded from ``source`` (None: the defaults).

    Attributes:
        agent: the agent's name.
        source: the hook file or module (for error messages), or None.
        pre, post: the hook functions (the defaults where the source defines none).
        pre_kwargs, post_kwargs: their keyword arguments from the config.
        obs_with_env: whether this agent reads the env's observation.
        vocab_size: the model's vocabulary (ids must be below it; None: unchecked), set by the env.
    """

    agent: str
    source: str | None = None
    pre: Callable[..., Any] = default_pre_process
    post: Callable[..., Any] = default_post_process
    pre_kwargs: dict[str, Any] = field(default_factory=dict)
    post_kwargs: dict[str, Any] = field(default_factory=dict)
    obs_with_env: bool = True
    vocab_size: int | None = None

    def _call(self, fn: Callable[..., Any], name: str, tokenizer: Any, *args: Any,
              **kwargs: Any) -> list[int]:
        from roll_ma.error_report import code_location, raise_location

        what = f"agent {self.agent!r}: {name}" + (f" of {self.source}" if self.source else "")
        file = getattr(getattr(fn, "__code__", None), "co_filename", None)
        try:
            out = fn(tokenizer, *args, **kwargs)
        except Exception as err:
            raise HookError(f"{what} raised {type(err).__name__}: {err}", raise_location(err, file),
                            f"correct {name} at that line (the log file has the full traceback)"
                            + self._or_default()) from err
        ids = _token_ids(out)
        if ids is None:
            raise HookError(f"{what} returned {type(out).__name__} {_shown(out)}; it must return a list of "
                            "token ids (ints)", code_location(fn),
                            f"return {RETURNS[name]} as token ids, e.g. tokenizer.encode(text, "
                            "add_special_tokens=False)" + self._or_default())
        vocab = self.vocab_size
        bad = [(i, t) for i, t in enumerate(ids) if t < 0 or (vocab is not None and t >= vocab)]
        if bad:  # why here: the model would fail on it later, deep in torch, without naming the hook
            pos, tok = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            ids_range = f"0..{vocab - 1}" if vocab else "0 and up"
            raise HookError(f"{what} returned token id {tok} at position {pos}{more}, outside the "
                            f"model's vocabulary (ids {ids_range})", code_location(fn),
                            "return ids of the tokenizer the hook is given (tokenizer.encode(text, "
                            "add_special_tokens=False)), not ids of another tokenizer or arithmetic on ids"
                            + self._or_default())
        return ids

    def _or_default(self) -> str:
        return "; or remove the agent's process to use the default prompt" if self.source else ""

    def prompt(self, tokenizer: Any, context_ids: list[int], obs_ids: list[int]) -> list[int]:
        """This agent's prompt ids from the team context and the observation (``pre_process``)."""
        obs = list(obs_ids) if self.obs_with_env else []
        return self._call(self.pre, "pre_process", tokenizer, list(context_ids), obs, **self.pre_kwargs)

    def context_after(self, tokenizer: Any, context_ids: list[int], response_ids: list[int]) -> list[int]:
        """The team context after this agent's response (``post_process``)."""
        return self._call(self.post, "post_process", tokenizer, list(context_ids), list(response_ids),
                          **self.post_kwargs)


def _check_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any], where: str, fixed: int) -> None:
    from roll_ma.workflows.lookup import keyword_names

    accepted = keyword_names(fn, fixed)
    if accepted is None:  # it takes **kwargs
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ValueError(f"{where} takes no keyword arguments {unknown}; it takes {sorted(accepted)}")


def load_hooks(agent: Any) -> AgentHooks:
    """The hooks of an ``AgentConfig`` (its ``process``, kwargs, ``obs_with_env``, ``system_prompt``).

    ValueError (a config problem) when the file or module is missing, defines neither hook, or a hook
    does not take the configured keyword arguments.
    """
    hooks = AgentHooks(agent.name, agent.process, pre_kwargs=dict(agent.pre_process_kwargs),
                       post_kwargs=dict(agent.post_process_kwargs), obs_with_env=bool(agent.obs_with_env))
    if agent.system_prompt and not agent.process:
        hooks.pre_kwargs.setdefault("system_prompt", agent.system_prompt)
    if not agent.process:
        for name, kwargs in (("pre_process", hooks.pre_kwargs), ("post_process", hooks.post_kwargs)):
            fn = default_pre_process if name == "pre_process" else default_post_process
            _check_kwargs(fn, kwargs, f"agent {agent.name!r}: the default {name}", 3)
        return hooks
    from roll_ma.registry import import_source, module_location

    module = import_source(agent.process)
    found = {n: getattr(module, n) for n in HOOK_NAMES if callable(getattr(module, n, None))}
    where = module_location(module)
    if not found:
        raise ValueError(f"agent {agent.name!r}: {where} defines neither pre_process nor post_process")
    if "pre_process" in found:
        hooks.pre = found["pre_process"]
        _check_kwargs(hooks.pre, hooks.pre_kwargs, f"pre_process of {where}", 3)
    elif hooks.pre_kwargs:
        raise ValueError(f"agent {agent.name!r}: pre_process_kwargs are set but {where} has no pre_process")
    if "post_process" in found:
        hooks.post = found["post_process"]
        _check_kwargs(hooks.post, hooks.post_kwargs, f"post_process of {where}", 3)
    elif hooks.post_kwargs:
        raise ValueError(f"agent {agent.name!r}: post_process_kwargs are set but {where} has no post_process")
    hooks.source = where
    return hooks
