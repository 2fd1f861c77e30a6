import { useCallback } from "react";
import { useSearchParams } from "react-router-dom";

/** List filters and paging kept in the URL (shareable, survive reload). A change that does not name
 * `pageKey` (`offset`, or e.g. a cursor) drops it, so a new filter starts from the first page. */
export function useQueryParams(pageKey = "offset") {
  const [params, setParams] = useSearchParams();
  const get = useCallback((name: string) => params.get(name) ?? "", [params]);
  // Several names in one update: two updates in a row would each start from the render's URL, the
  // second undoing the first.
  const update = useCallback(
    (changes: Record<string, string>) =>
      setParams(
        (previous) => {
          const next = new URLSearchParams(previous);
          for (const [name, value] of Object.entries(changes)) {
            if (value) next.set(name, value);
            else next.delete(name);
          }
          if (!(pageKey in changes)) next.delete(pageKey);
          return next;
        },
        { replace: true },
      ),
    [setParams, pageKey],
  );
  const set = useCallback((name: string, value: string) => update({ [name]: value }), [update]);
  const clear = useCallback(() => setParams(new URLSearchParams(), { replace: true }), [setParams]);
  return { params, get, set, update, clear };
}
