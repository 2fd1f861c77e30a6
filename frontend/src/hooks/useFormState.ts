import { useState } from "react";
import { ApiError } from "../api/client";

/** A form's submit state: `run(action)` marks it busy, clears the last error, runs the action and
 *  keeps what it threw (field errors of a 400 in `errors`). Resolves true when the action succeeded. */
export function useFormState() {
  const [error, setError] = useState<Error | null>(null);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(false);
  const run = async (action: () => Promise<unknown>): Promise<boolean> => {
    setBusy(true);
    setError(null);
    setSaved(false);
    try {
      await action();
      setSaved(true);
      return true;
    } catch (err) {
      setError(err instanceof Error ? err : new Error(String(err)));
      return false;
    } finally {
      setBusy(false);
    }
  };
  const clearError = () => setError(null);
  return { error, busy, saved, run, clearError, errors: error instanceof ApiError ? error.fieldErrors : undefined };
}
