"""Prompt hooks of the MARFT Reasoner -> Actor team (examples/math/marft_*.yaml).

Each agent reads the problem (the env's observation) and what the agents before it said, as
one chat turn; its answer joins the team's context as ``<Speaker>: <answer>``. The text is the
history format the math envs render (``Problem: 37+48\\nSolver: \\boxed{84}``), which the
built-in tiny model was pre-trained on.
"""


def pre_process(tokenizer, prompt_ids, obs_ids, system_prompt):
    """This agent's prompt: (system prompt, problem + the team's context so far), chat-templated."""
    history = tokenizer.decode(obs_ids, skip_special_tokens=True) + tokenizer.decode(prompt_ids,
                                                                                      skip_special_tokens=True)
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": history}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def post_process(tokenizer, prompt_ids, response_ids, speaker):
    """The team's context after this agent: ``\\n<speaker>: <its answer>`` appended."""
    answer = tokenizer.decode(response_ids, skip_special_tokens=True).strip()
    return list(prompt_ids) + tokenizer.encode(f"\n{speaker}: {answer}", add_special_tokens=False)
