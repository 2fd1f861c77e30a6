import { useEffect, useRef } from "react";
import type { SampleMark } from "../../api/types";
import { reviewKey } from "./review";

export interface ReviewKeyHandlers {
  /** j: 1, k: -1. */
  move: (step: 1 | -1) => void;
  /** 1 / 2 / 3, called only while `canMark`. */
  mark: (mark: SampleMark) => void;
  canMark: boolean;
}

/** The review keyboard of a list beside a side-by-side view (review.ts's reviewKey map). The listener is
 * added once and reads the latest handlers, so a key pressed right after another (j then 3) acts on what
 * the first one selected. */
export function useReviewKeys(handlers: ReviewKeyHandlers): void {
  const latest = useRef(handlers);
  latest.current = handlers;
  useEffect(() => {
    const onKey = (event: KeyboardEvent) => {
      const key = reviewKey(event);
      if (!key) return;
      const state = latest.current;
      if (key.kind === "next" || key.kind === "previous") {
        event.preventDefault();
        state.move(key.kind === "next" ? 1 : -1);
      } else if (state.canMark) {
        event.preventDefault();
        state.mark(key.mark);
      }
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);
}
