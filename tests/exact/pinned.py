"""Pinned nasty worlds, as specs (``hsd_core.worlds.from_spec``), used as Hypothesis ``@example``s."""

from hsd_core.strategies import World
from hsd_core.worlds import from_spec

ABC = ["a", "b", "c"]

NASTY: dict[str, dict[str, object]] = {
    # target tokens that are prefixes of others, drafter too
    "prefix_tokens": {"target": {"tokens": ABC + ["ab", "abc"], "random": 1},
                      "drafter": {"tokens": ABC + ["bc", "b" + "ca"], "random": 2}, "prompt": "a"},
    # BPE target whose merges make canonical and emitted tokenizations differ
    "non_canonical_target": {"target": {"tokens": ABC + ["bc", "ab"], "merges": [["b", "c"], ["a", "b"]],
                                        "random": 3}, "drafter": {"tokens": ABC + ["ab"], "random": 4},
                             "prompt": "ab"},
    # intersection as small as the vocabularies allow: the characters and EOS
    "smallest_intersection": {"target": {"tokens": ABC + ["ab", "bc"], "random": 5},
                              "drafter": {"tokens": ABC + ["ca", "cb"], "random": 6, "outside_factor": 20}},
    # drafter mass entirely outside the intersection (TLI falls back to target decoding)
    "mass_outside": {"target": {"tokens": ABC + ["ab"], "random": 7},
                     "drafter": {"tokens": ABC + ["ca", "cc"], "random": 8, "only_outside": True}},
    # the drafter is the target over another vocabulary (same strings, other ids)
    "drafter_is_target": {"target": {"tokens": ABC + ["ab", "ca"], "random": 9},
                          "drafter": {"tokens": ["ca", "c", "ab", "b", "a"], "relabel_target": True}},
    # one-hot laws on both sides
    "one_hot": {"target": {"tokens": ABC + ["ab"], "random": 10, "one_hot": True},
                "drafter": {"tokens": ABC + ["bc"], "random": 11, "one_hot": True}},
    # disjoint supports: the drafter never proposes what the target can emit
    "disjoint_supports": {"target": {"tokens": ABC + ["ab"], "random": 12, "support": ["a", "ab", "<eos>"]},
                          "drafter": {"tokens": ABC + ["bc"], "random": 13, "support": ["b", "c", "bc"]}},
    # EOS likely at every position, on both sides
    "eos_everywhere": {"target": {"tokens": ABC + ["ab"], "random": 14, "eos_weight": 12},
                       "drafter": {"tokens": ABC + ["ba"], "random": 15, "eos_weight": 12}},
    # the prompt ends in the middle of a target token ("ab" of "abc") and of a drafter token
    "prompt_mid_token": {"target": {"tokens": ABC + ["abc", "ab"], "random": 16},
                         "drafter": {"tokens": ABC + ["bca"], "random": 17}, "prompt": "ab"},
    # duplicate strings in both vocabularies
    "duplicate_strings": {"target": {"tokens": ABC + ["ab", "ab"], "random": 18},
                          "drafter": {"tokens": ABC + ["ab", "ab", "bc"], "random": 19}},
}


def world(name: str) -> World:
    target, drafter, prompt = from_spec(NASTY[name])
    return World(target, drafter, prompt, name)
