// The rows of one page of a review list (an offline run's samples, a shadow config's pairs), the one
// selected, and moving through them across pages: what the run page and the shadow-pairs page share.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import type { useQueryParams } from "../../hooks/useQueryParams";

interface ReviewPage<T> {
  results: T[];
  count: number;
}

export function usePagedReview<T extends { id: number }>(
  page: ReviewPage<T> | undefined,
  offset: number,
  pageSize: number,
  query: ReturnType<typeof useQueryParams>,
) {
  // A mark's answer replaces its row here at once; the next fetch brings the same.
  const [updated, setUpdated] = useState<Record<number, T>>({});
  const [selected, setSelected] = useState(0);
  // After j on the last row (k on the first) the next (previous) page opens on its first (last) row.
  const pendingSelect = useRef<"first" | "last" | null>(null);

  useEffect(() => setUpdated({}), [page]);
  const rows = useMemo(() => (page?.results ?? []).map((row) => updated[row.id] ?? row), [page, updated]);
  useEffect(() => {
    if (!page) return;
    if (pendingSelect.current === "first") setSelected(0);
    else if (pendingSelect.current === "last") setSelected(Math.max(0, page.results.length - 1));
    else setSelected((index) => Math.min(index, Math.max(0, page.results.length - 1)));
    pendingSelect.current = null;
  }, [page]);

  const count = page?.count ?? 0;
  const move = useCallback(
    (step: 1 | -1) => {
      const next = selected + step;
      if (next >= 0 && next < rows.length) {
        setSelected(next);
      } else if (step === 1 && offset + pageSize < count) {
        pendingSelect.current = "first";
        query.set("offset", String(offset + pageSize));
      } else if (step === -1 && offset > 0) {
        pendingSelect.current = "last";
        query.set("offset", String(Math.max(0, offset - pageSize)));
      }
    },
    [selected, rows.length, offset, pageSize, count, query],
  );
  const replace = useCallback((row: T) => setUpdated((previous) => ({ ...previous, [row.id]: row })), []);

  return { rows, selected, setSelected, current: rows[selected] as T | undefined, count, move, replace };
}
