import { Table } from "../../components/Table";
import type { Problem } from "../../api/types";

/** Each bad file of a verification: what was wrong, the expected and the actual hash. */
export function ProblemsTable({ problems, testId }: { problems: Problem[]; testId?: string }) {
  return (
    <Table
      testId={testId}
      rows={problems}
      rowKey={(p) => `${p.path}:${p.kind}`}
      columns={[
        { header: "File", cell: (p) => <code>{p.path}</code> },
        { header: "Problem", cell: (p) => <strong>{p.kind}</strong> },
        { header: "Expected sha256", cell: (p) => <code title={p.expected ?? ""}>{shortHash(p.expected)}</code> },
        { header: "Actual sha256", cell: (p) => <code title={p.actual ?? ""}>{shortHash(p.actual)}</code> },
        { header: "Detail", cell: (p) => p.detail || <span className="muted">—</span> },
      ]}
    />
  );
}

export function shortHash(hash: string | null | undefined): string {
  return hash ? `${hash.slice(0, 12)}…${hash.slice(-6)}` : "—";
}
