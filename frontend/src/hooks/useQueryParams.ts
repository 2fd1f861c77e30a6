import { useCallback } from "react";
import { useSearchParams } from "react-router-dom";

/** List filters and paging kept in the URL (shareable, survive reload); changing a filter resets `offset`. */
export function useQueryParams() {
  const [params, setParams] = useSearchParams();
  const get = useCallback((name: string) => params.get(name) ?? "", [params]);
  const set = useCallback(
    (name: string, value: string) =>
      setParams(
        (previous) => {
          const next = new URLSearchParams(previous);
          if (value) next.set(name, value);
          else next.delete(name);
          if (name !== "offset") next.delete("offset");
          return next;
        },
        { replace: true },
      ),
    [setParams],
  );
  // Several names at once, exactly as given (`offset` is left alone unless named): two `set` calls in a row
  // would each start from the same URL, the second undoing the first.
  const setAll = useCallback(
    (values: Record<string, string>) =>
      setParams(
        (previous) => {
          const next = new URLSearchParams(previous);
          for (const [name, value] of Object.entries(values)) {
            if (value) next.set(name, value);
            else next.delete(name);
          }
          return next;
        },
        { replace: true },
      ),
    [setParams],
  );
  const clear = useCallback(() => setParams(new URLSearchParams(), { replace: true }), [setParams]);
  return { params, get, set, setAll, clear };
}
