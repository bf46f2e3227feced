"""Checks every drafter must pass, shared by the tests of each (MTP layers, Gemma 4's assistant, EAGLE-3 heads)."""
from app.engine import Done, DraftParams, Engine, GenerationParams, SamplingParams
from app.engine.grammar import Grammar
from test_exact_sampling import N, compare, samples


def run(engine: Engine, ids, drafter: str, max_tokens: int = 200, temperature: float = 0.0, grammar=None,
        **draft) -> Done:
    params = GenerationParams(max_tokens=max_tokens, sampling=SamplingParams(temperature=temperature, seed=1),
                              draft=DraftParams(**draft), grammar=grammar)
    events = list(engine.generate(ids, params, drafter))
    assert isinstance(events[-1], Done)
    return events[-1]


def second_turn_stays_exact(engine: Engine, drafter: str) -> None:
    """A second chat turn reuses the cached prefix, drafts with tokens accepted, and says what speculation off
    says from a cleared cache."""
    engine.reset()
    turn1 = engine.chat_tokens([{"role": "user", "content": "the cat sat"}])
    first = run(engine, turn1, drafter, max_tokens=40, draft_max=4, draft_p_min=0.0)
    turn2 = engine.chat_tokens([{"role": "user", "content": "the cat sat"},
                                {"role": "assistant", "content": first.text},
                                {"role": "user", "content": "and then?"}])
    second = run(engine, turn2, drafter, max_tokens=60, draft_max=4, draft_p_min=0.0)
    assert second.stats.prompt_cached > 0 and second.stats.n_accepted > 0
    engine.reset()
    assert run(engine, turn2, "none", max_tokens=60).token_ids == second.token_ids


def samples_the_target_distribution(engine: Engine, drafter: str, ids=(1, 300, 301, 302)) -> None:
    """Sampled output with the drafter follows the target's distribution (chi-square against speculation off),
    with plenty drafted."""
    engine.reset()
    plain, _ = samples(engine, list(ids), "none", seed0=40_000)
    spec, drafted = samples(engine, list(ids), drafter, draft_max=3, draft_p_min=0.0)
    assert drafted > N
    compare(plain, spec)


def greedy_under_a_grammar_stays_exact(engine: Engine, drafter: str) -> None:
    """Under a grammar where free text alternates with runs it forces, the drafter drafts the free text (its run
    ends where the grammar starts forcing), the forced runs join the draft, and the answer is speculation off's."""
    grammar = Grammar.lark(r"start: /([^xyz]{1,4}xyz)+/", "test")
    ids = engine.chat_tokens([{"role": "user", "content": "the cat sat"}])
    engine.reset()
    plain = run(engine, ids, "none", max_tokens=60, grammar=grammar)
    engine.reset()
    spec = run(engine, ids, drafter, max_tokens=60, grammar=grammar, draft_max=4, draft_p_min=0.0)
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 60
    s = spec.stats
    assert s.n_forced > 0 and s.n_drafted > s.n_forced  # forced runs, and the drafter's own tokens beside them
