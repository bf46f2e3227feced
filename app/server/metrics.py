"""``/metrics``: llama-server's Prometheus counters and gauges (``llamacpp:…``, the names and help of its
``server_task_result_metrics::to_metrics``), counted over every generation the API served, speculative counters
included. Served only when the server was started with ``--metrics``, as llama-server; otherwise 501.

Every generation passes through ``Metrics.observe`` (``slot.Slot.generate`` wraps its batches), so each endpoint
is counted alike, once, when its answer is done. The gauges of throughput are averaged over the time since the last
scrape, as llama-server's are."""
from __future__ import annotations

import threading
import time
from typing import AsyncGenerator

from ..engine import Done, Round, Stats


class Metrics:
    def __init__(self):
        self.started = int(time.time())
        self._lock = threading.Lock()
        self.prompt_tokens = self.prompt_cached = self.predicted = self.decodes = self.n_tokens_max = 0
        self.prompt_seconds = self.predicted_seconds = 0.0
        self.drafted = self.accepted = self.drafts = 0
        self.processing = 0
        self._bucket = [0, 0.0, 0, 0.0]  # since the last scrape: prompt tokens, their seconds, predicted, seconds

    async def observe(self, batches: AsyncGenerator[list, None]) -> AsyncGenerator[list, None]:
        """``batches`` passed on, counted: a generation is processing from its first batch, and counted when done.
        One that ends before its Done (its client went away) is counted as far as its last round, as llama-server
        flushes a slot's tokens when a cancel releases it: they were generated all the same."""
        drafts, begun, last = 0, False, None
        try:
            async for batch in batches:
                if not begun:
                    begun = True
                    with self._lock:
                        self.processing += 1
                for ev in batch:
                    if isinstance(ev, Round):
                        drafts += ev.n_drafted > 0
                        last = ev.stats
                    elif isinstance(ev, Done):
                        self.add(ev.stats, drafts)
                        last = None
                yield batch
        finally:
            if begun:
                with self._lock:
                    self.processing -= 1
                if last is not None:
                    self.add(last, drafts)
            await batches.aclose()

    def add(self, s: Stats, drafts: int) -> None:
        """One finished generation: its measured stats and how many of its rounds verified a draft."""
        with self._lock:
            self.prompt_tokens += s.prompt_tokens
            self.prompt_cached += s.prompt_cached
            self.prompt_seconds += s.time_to_first_token_s
            self.predicted += s.n_tokens
            self.predicted_seconds += s.decode_seconds
            self.decodes += s.n_rounds + (1 if s.prompt_tokens else 0)
            self.n_tokens_max = max(self.n_tokens_max, s.prompt_tokens + s.prompt_cached + s.n_tokens)
            self.drafted += s.n_drafted
            self.accepted += s.n_accepted
            self.drafts += drafts
            b = self._bucket
            b[0] += s.prompt_tokens
            b[1] += s.time_to_first_token_s
            b[2] += max(s.n_tokens - 1, 0)  # the first token comes with the prompt: the rate is over the rest
            b[3] += s.decode_seconds

    def text(self, waiting: int) -> str:
        """The Prometheus text (``waiting``: the API's requests queued or running); the gauges' window restarts."""
        with self._lock:
            b, self._bucket = self._bucket, [0, 0.0, 0, 0.0]
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
                 self.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.prompt_cached),
                ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_seconds),
                ("tokens_predicted_total", "Number of generation tokens processed", self.predicted),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_seconds),
                ("n_decode_total", "Total number of llama_decode() calls of the target: one per prompt and one per "
                                   "round (SpecChat counts a prompt evaluated in several batches once)", self.decodes),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", self.drafted),
                ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target "
                                                          "model", self.accepted),
                ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
                 self.drafts),
            ]
            gauges = [
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", b[0] / b[1] if b[1] else 0.0),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s", b[2] / b[3] if b[3] else 0.0),
                ("requests_processing", "Number of requests processing", self.processing),
                ("requests_deferred", "Number of requests deferred", max(waiting - self.processing, 0)),
                ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", 1.0),
            ]
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in items:
                lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                          f"llamacpp:{name} {value}"]
        return "\n".join(lines) + "\n"
