"""The engine's counters, read by ``/metrics``: deliveries by outcome, attempts, latency, circuit state.

Plain counters updated on the engine's loop (a dict increment each); the exposition reads them.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

__all__ = ["LATENCY_BUCKETS", "DeliveryMetrics"]

#: upper bounds (seconds) of the commit-to-receipt latency histogram
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class DeliveryMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: Counter[tuple[str, str, str]] = Counter()  # (partner, endpoint, delivered|dead)
        self.attempts: Counter[tuple[str, str, str]] = Counter()  # (partner, endpoint, outcome)
        self.latency: dict[tuple[str, str], list[float]] = {}  # bucket counts + [sum, count]

    def attempt(self, config: Any, outcome: str, seconds: float) -> None:
        with self._lock:
            self.attempts[(config.partner, config.name, outcome)] += 1

    def delivered(self, config: Any, seconds: float) -> None:
        with self._lock:
            self.outcomes[(config.partner, config.name, "delivered")] += 1
            row = self.latency.setdefault((config.partner, config.name), [0.0] * (len(LATENCY_BUCKETS) + 2))
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    row[i] += 1
            row[-2] += seconds
            row[-1] += 1

    def dead(self, config: Any) -> None:
        with self._lock:
            self.outcomes[(config.partner, config.name, "dead")] += 1

    def render(self, depths: dict[tuple[str, str], int], circuits: dict[tuple[str, str], str]) -> str:
        """Prometheus text exposition of the counters, with queue depths and circuit states given."""
        lines = [
            "# HELP b2b_deliveries_total Deliveries settled, by outcome (delivered, dead).",
            "# TYPE b2b_deliveries_total counter",
        ]
        with self._lock:
            outcomes, attempts = dict(self.outcomes), dict(self.attempts)
            latency = {k: list(v) for k, v in self.latency.items()}
        for (p, e, o), n in sorted(outcomes.items()):
            lines.append(f'b2b_deliveries_total{{partner="{p}",endpoint="{e}",outcome="{o}"}} {n}')
        lines += [
            "# HELP b2b_delivery_attempts_total Attempts made, by outcome (delivered, retry, failed).",
            "# TYPE b2b_delivery_attempts_total counter",
        ]
        for (p, e, o), n in sorted(attempts.items()):
            lines.append(f'b2b_delivery_attempts_total{{partner="{p}",endpoint="{e}",outcome="{o}"}} {n}')
        lines += [
            "# HELP b2b_delivery_latency_seconds From the commit that queued a delivery to its 2xx answer.",
            "# TYPE b2b_delivery_latency_seconds histogram",
        ]
        for (p, e), row in sorted(latency.items()):
            for i, bound in enumerate(LATENCY_BUCKETS):
                lines.append(
                    f'b2b_delivery_latency_seconds_bucket{{partner="{p}",endpoint="{e}",le="{bound}"}} {int(row[i])}'
                )
            lines.append(
                f'b2b_delivery_latency_seconds_bucket{{partner="{p}",endpoint="{e}",le="+Inf"}} {int(row[-1])}'
            )
            lines.append(f'b2b_delivery_latency_seconds_sum{{partner="{p}",endpoint="{e}"}} {row[-2]:.6f}')
            lines.append(f'b2b_delivery_latency_seconds_count{{partner="{p}",endpoint="{e}"}} {int(row[-1])}')
        lines += [
            "# HELP b2b_delivery_queue_depth Deliveries waiting in an endpoint's queue.",
            "# TYPE b2b_delivery_queue_depth gauge",
        ]
        for (p, e), n in sorted(depths.items()):
            lines.append(f'b2b_delivery_queue_depth{{partner="{p}",endpoint="{e}"}} {n}')
        lines += [
            "# HELP b2b_delivery_circuit_open Whether an endpoint's circuit breaker is open (1) or half open (0.5).",
            "# TYPE b2b_delivery_circuit_open gauge",
        ]
        for (p, e), state in sorted(circuits.items()):
            value = {"closed": 0, "half_open": 0.5, "open": 1}[state]
            lines.append(f'b2b_delivery_circuit_open{{partner="{p}",endpoint="{e}"}} {value}')
        return "\n".join(lines) + "\n"
