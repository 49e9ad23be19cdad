"""A reply's counters (engine/core/counters.py): typed fields, and the flat JSON keys the page and API read."""

import json
from dataclasses import fields

from engine.core.counters import GROUPS, Counters, KvReuseCounters, NetworkCounters, SpeculationCounters
from engine.core.timeline import Timeline


def test_a_group_that_did_not_run_has_no_keys_and_one_that_ran_has_all():
    c = Counters(seed=7)
    assert c.to_dict() == {"seed": 7}  # unknown scalars are left out (null to a reader), never 0
    c.kv = KvReuseCounters("off")
    assert c.to_dict() == {"seed": 7, "kv_reuse": "off", "kv_copy_ms": None, "kv_handover": None, "kv_from": None}


def test_every_key_is_declared_once_and_none_shadows_a_timeline_key():
    names = [f.name for f in fields(Counters) if f.name not in GROUPS]
    names += [f.name for kind in GROUPS.values() for f in fields(kind)]
    assert len(names) == len(set(names))  # the flat JSON cannot hold two fields of one name
    tl = Timeline()
    tl.token_ns = [tl.received_ns + 1, tl.received_ns + 2]
    own = set(tl.to_dict())  # the Timeline's own keys, without counters
    assert not own & set(names), own & set(names)


def test_the_json_reads_back_into_the_same_counters():
    tl = Timeline()
    tl.counters = Counters(seed=3, quantization="int8wo", kernels={"prefill": "a", "decode": "b"},
                           speculation=SpeculationCounters(speculative="prompt_lookup", drafted=8, accepted=5,
                                                           accepted_hist=[1, 0, 2]),
                           network=NetworkCounters(net_send_ms=0.5, connection_reused=True))
    wire = json.loads(json.dumps(tl.to_dict()))
    assert wire["drafted"] == 8 and wire["seed"] == 3 and wire["net_dns_ms"] is None
    assert Counters.from_dict(wire) == tl.counters
    assert Counters.from_dict({}) == Counters()
