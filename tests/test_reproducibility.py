"""Rollouts reproducible under load (issue 30 item 11): each sample has its own request seed, so the same
checkpoint, config and seed give the same rollout tree however Ray Data bundles the rows, however fast the
stages and engines run, and on however many engines. Real vLLM (CPU), local Ray, the tiny model."""

import gc
import subprocess
import sys
import time

import pytest
import ray.cloudpickle

from rlcr.rollout.pipeline import run_rollouts
from rlcr.tasks.countdown import generate_tasks, turn1_messages
from test_rollout import GA, GC, tiny_cfg

TASKS = list(enumerate(generate_tasks(5, seed=11)))


def test_request_seeds_are_distinct_per_sample_stage_and_iteration():
    """Every answer and confidence of an iteration (and of its evaluation) gets a seed of its own."""
    from rlcr.seeds import answer_seed, confidence_seed, eval_salt, rollout_seed

    seeds = []
    for base in (rollout_seed(3, 0), rollout_seed(3, 1), rollout_seed(3, 0, salt=eval_salt(0))):
        seeds += [answer_seed(base, p, k) for p in range(64) for k in range(8)]
        seeds += [confidence_seed(base, p, a, h) for p in range(64) for a in range(8) for h in range(4)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**31 for s in seeds)
    assert answer_seed(5, 2, 1) == answer_seed(5, 2, 1)  # a function of the sample's identity only


@pytest.mark.slow
def test_a_sample_does_not_depend_on_its_batch(tiny_model_dir, tiny_tokenizer):
    """One in-process engine: the same seeded requests alone, in one large call (more prompt tokens than
    one engine step takes, so prefills are scheduled over several steps) and in other groups and orders
    give the same tokens; log-probs equal up to float rounding (the kernels see other batch shapes)."""
    from rlcr.models.chat import render_prompt
    from rlcr.rollout.engine import create_engine
    from rlcr.rollout.sampling import sample
    from rlcr.seeds import answer_seed

    cfg = tiny_cfg(tiny_model_dir, "unused")
    gc.collect()  # an in-process engine another test dropped must not be collected while this one runs
    llm = create_engine(tiny_model_dir, cfg, seed=123)
    tasks = list(enumerate(generate_tasks(24, seed=5)))
    prompts = [render_prompt(tiny_tokenizer, turn1_messages(t))[1] for _, t in tasks]
    seeds = [[answer_seed(99, i, k) for k in range(4)] for i, _ in tasks]
    kw = dict(n=4, temperature=1.0, top_p=1.0, max_tokens=40)
    assert sum(map(len, prompts)) * 4 > 2048  # vLLM's default token budget per step
    whole = sample(llm, prompts, seeds=seeds, **kw)
    parts = {}
    for group in ([7, 3, 20], list(range(23, 10, -1)), [0, 1, 2, 4, 5, 6, 8, 9, 10]):
        for i, out in zip(group, sample(llm, [prompts[i] for i in group], seeds=[seeds[i] for i in group], **kw)):
            parts[i] = out
    assert sorted(parts) == list(range(24))
    for i in range(24):
        assert [s.completion_ids for s in whole[i]] == [s.completion_ids for s in parts[i]], i
        for a, b in zip(whole[i], parts[i]):
            assert a.completion_text == b.completion_text
            assert a.completion_logprobs == pytest.approx(b.completion_logprobs, abs=1e-4)
    distinct = {tuple(s.completion_ids) for group in whole for s in group}
    assert len(distinct) == 24 * 4  # every seed draws its own sample
    other = sample(llm, prompts[:2], seeds=[[s + 1 for s in seeds[0]], seeds[1]], **kw)
    assert [s.completion_ids for s in other[1]] == [s.completion_ids for s in whole[1]]
    assert [s.completion_ids for s in other[0]] != [s.completion_ids for s in whole[0]]


@pytest.mark.slow
def test_pipelined_turns_sample_the_two_call_tree_and_a_failure_leaves_the_engine_empty(tiny_model_dir,
                                                                                       tiny_tokenizer):
    """:func:`~rlcr.rollout.sampling.sample_tree` (turn 2 sent as each answer finishes) draws the tokens of the
    two-call way (all answers, then all confidences) with the same seeds; a turn-2 conversation that cannot be
    rendered mid-run raises naming its row and aborts what is still in the engine, which then samples as before."""
    from rlcr.rollout.engine import create_engine
    from rlcr.rollout.sampling import run_requests, sample_chats, sample_tree, sampling_params as params
    from rlcr.seeds import answer_seed, confidence_seed
    from rlcr.tasks.countdown import turn2_messages

    cfg = tiny_cfg(tiny_model_dir, "unused")
    gc.collect()  # an in-process engine another test dropped must not be collected while this one runs
    llm = create_engine(tiny_model_dir, cfg, seed=123)
    tasks = generate_tasks(6, seed=5)
    conversations = [turn1_messages(t) for t in tasks]
    labels = [f"prompt_id={i}" for i in range(6)]
    seeds = [[answer_seed(7, i, k) for k in range(3)] for i in range(6)]
    conf = [[[confidence_seed(7, i, k, h) for h in range(2)] for k in range(3)] for i in range(6)]
    kw = dict(temperature=1.0, top_p=1.0)
    # a tiny random model never writes the closing tags; stopping at "e" ends its samples at different lengths,
    # so some answers are done (and their turn 2 running) while others still decode
    lengths, stops = (40, 24), (("e",), ("e",))

    def turn2(i, k, s):
        return turn2_messages(tasks[i], s.completion_text), f"prompt_id={i} answer_id={k}", conf[i][k]

    contexts, answers, tree = sample_tree(llm, tiny_tokenizer, conversations, labels=labels, seeds=seeds, turn2=turn2,
                                          max_prompt_tokens=512, max_tokens=lengths, stop=stops, **kw)
    _, two_call = sample_chats(llm, tiny_tokenizer, conversations, labels=labels, mask_kind="answer", seeds=seeds,
                               n=3, max_prompt_tokens=512, max_tokens=lengths[0], stop=stops[0], **kw)
    assert [[s.completion_ids for s in g] for g in answers] == [[s.completion_ids for s in g] for g in two_call]
    assert len({len(s.completion_ids) for g in answers for s in g}) > 3  # the answers did end at different steps
    flat = [(i, k, s) for i, g in enumerate(two_call) for k, s in enumerate(g)]
    ctx2, confs = sample_chats(llm, tiny_tokenizer, [turn2_messages(tasks[i], s.completion_text) for i, _, s in flat],
                               labels=[f"{i}/{k}" for i, k, _ in flat], mask_kind="confidence",
                               seeds=[conf[i][k] for i, k, _ in flat], n=2, max_prompt_tokens=512,
                               max_tokens=lengths[1], stop=stops[1], **kw)
    for (i, k, _), c, group in zip(flat, ctx2, confs):
        conversation, context, got = tree[i][k]
        assert conversation == turn2_messages(tasks[i], answers[i][k].completion_text) and context == c
        assert [s.completion_ids for s in got] == [s.completion_ids for s in group]
        assert [s.loss_mask for s in got] == [s.loss_mask for s in group]
        for a, b in zip(got, group):
            assert a.completion_logprobs == pytest.approx(b.completion_logprobs, abs=1e-4)

    def failing(i, k, s):
        if (i, k) == (2, 1):
            return turn2_messages(tasks[i], "x " * 600), f"prompt_id={i} answer_id={k}", conf[i][k]
        return turn2(i, k, s)

    # a follow-up request starts as soon as its request is done: a short one's follow-up ends before a long one
    finished = []

    def _params(max_tokens, seed):
        return params(temperature=1.0, top_p=1.0, max_tokens=max_tokens, stop=None, seed=seed)

    def follow(tag, s):
        finished.append(tag)
        return [(("then", tag), prompt, _params(3, 3))] if tag == "short" else ()

    prompt = contexts[0][1]
    run_requests(llm, [("long", prompt, _params(60, 1)), ("short", prompt, _params(2, 2))], follow)
    assert finished == ["short", ("then", "short"), "long"]

    with pytest.raises(ValueError, match="prompt_id=2 answer_id=1: rendered prompt has"):
        sample_tree(llm, tiny_tokenizer, conversations, labels=labels, seeds=seeds, turn2=failing,
                    max_prompt_tokens=512, max_tokens=lengths, stop=stops, **kw)
    assert not llm.llm_engine.has_unfinished_requests()
    _, again = sample_chats(llm, tiny_tokenizer, conversations, labels=labels, mask_kind="answer", seeds=seeds,
                            n=3, max_prompt_tokens=512, max_tokens=lengths[0], stop=stops[0], **kw)
    assert [[s.completion_ids for s in g] for g in again] == [[s.completion_ids for s in g] for g in two_call]


# the engine actor class below lives in this test module, which Ray's workers cannot import: send it by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _SlowEngine:
    """Test hook: a RolloutEngine whose every generate call first sleeps ``delay_s`` (an engine under load)."""

    def __init__(self, cfg, policy_uri, delay_s):
        from rlcr.rollout.engine import RolloutEngine

        self.engine, self.delay_s = RolloutEngine(cfg, policy_uri), delay_s

    def current(self):
        return self.engine.current()

    def generate_chats(self, conversations, **kwargs):
        time.sleep(self.delay_s)
        return self.engine.generate_chats(conversations, **kwargs)

    def generate_tree(self, conversations, **kwargs):
        time.sleep(self.delay_s)
        return self.engine.generate_tree(conversations, **kwargs)


class _Engines:
    """What the pipeline takes of an :class:`~rlcr.rollout.engine.EnginePool`: engine actor names."""

    def __init__(self, names):
        self.names = names


def _burn_cpu():
    """A process spinning on one core (the machine under load); the caller kills it."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _tree(rows):
    def key(r):
        return (r["sample_type"], r["prompt_id"], r["answer_id"], r["confidence_id"] or 0)

    return {key(r): r for r in rows}


@pytest.mark.slow
def test_same_rollouts_whatever_the_batching_timing_and_engines(ray_local, tiny_model_dir, tmp_path):
    """The same iteration rolled out twice: (a) one engine per stage actor, all prompts in one batch, both
    turns in one engine run (``rollout.pipeline_turns``); (b) one prompt per batch (other Ray Data
    blocks and bundles, other confidence batches), turn 2 sampled by the confidence stage after its answers
    (the two-call way), two stage actors sharing two engines that each sleep before every generate call
    (0.2 s, 0.7 s), a CPU burner running. Same tokens, texts, rewards and advantages."""
    import ray

    from rlcr.rollout.engine import engine_runtime_env
    from rlcr.runs.cluster import ENGINE_ACTOR_CPUS

    # rollout_batch_size 8: all five prompts in one batch; both turns in one engine run
    quiet = tiny_cfg(tiny_model_dir, tmp_path).model_copy(update={"rollout.pipeline_turns": True})
    loaded = quiet.model_copy(update={"rollout.batch_size": 1, "rollout.actors": 2, "rollout.pipeline_turns": False})
    names = [f"rlcr-slow-engine-{i}" for i in range(2)]
    actors = [ray.remote(_SlowEngine).options(  # (b)'s engines load while (a) runs
        name=n, num_cpus=ENGINE_ACTOR_CPUS, max_concurrency=1, runtime_env=engine_runtime_env()).remote(
        loaded.model_dump(mode="json"), str(tiny_model_dir), delay) for n, delay in zip(names, (0.2, 0.7))]
    burner = None
    try:
        a = run_rollouts(quiet, TASKS, policy_uri=str(tiny_model_dir), run_id="quiet", iteration=2)
        burner = _burn_cpu()
        ray.get([x.current.remote() for x in actors])
        b = run_rollouts(loaded, TASKS, policy_uri=str(tiny_model_dir), run_id="loaded", iteration=2,
                         engines=_Engines(names))
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
        for x in actors:
            ray.kill(x)
    ta, tb = _tree(a.rows), _tree(b.rows)
    assert a.timings["rollout/confidence_generate_s"] == 0.0 < b.timings["rollout/confidence_generate_s"]
    assert ta.keys() == tb.keys() and len(ta) == len(TASKS) * GA * (1 + GC)
    for k in ta:
        ra, rb = ta[k], tb[k]
        for field in ("context_ids", "completion_ids", "completion_text", "loss_mask", "reward", "correct",
                      "confidence", "advantage", "finish_reason"):
            assert ra[field] == rb[field], (k, field)
        assert ra["completion_logprobs"] == pytest.approx(rb["completion_logprobs"], abs=1e-4), k
