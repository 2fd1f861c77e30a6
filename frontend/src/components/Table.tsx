import { Fragment, useLayoutEffect, useRef, useState } from "react";
import type { Key, ReactNode } from "react";

export interface Column<T> {
  header: ReactNode;
  /** What the cell shows. */
  cell: (row: T) => ReactNode;
  className?: string;
  /** Long text (names, reasons, what changed) wraps instead of widening the table. */
  wrap?: boolean;
  /**
   * Columns without one are essential and always shown. When the table is wider than its box, the
   * column with the highest priority number is folded first (then the next), and each row gets a
   * ▸ button that opens its folded values below it: nothing sits behind a sideways scrollbar.
   */
  priority?: number;
  /** The folded value's label when the header is not plain text (e.g. a sort button). */
  label?: string;
}

interface TableProps<T> {
  columns: Column<T>[];
  rows: T[] | undefined;
  rowKey: (row: T) => Key;
  loading?: boolean;
  empty?: ReactNode;
  /** Shown under the table when the list is paged (see <Pagination>). */
  pagination?: ReactNode;
  onRowClick?: (row: T) => void;
  /** Extra class of a row (e.g. the selected one). */
  rowClassName?: (row: T) => string | undefined;
  testId?: string;
}

function cellClass<T>(column: Column<T>): string | undefined {
  return [column.className, column.wrap ? "wrap" : ""].filter(Boolean).join(" ") || undefined;
}

/** The indexes of the columns to fold, in folding order: highest priority number first, rightmost first. */
function foldOrder<T>(columns: Column<T>[]): number[] {
  return columns
    .map((column, index) => ({ index, priority: column.priority }))
    .filter((c): c is { index: number; priority: number } => c.priority !== undefined)
    .sort((a, b) => b.priority - a.priority || b.index - a.index)
    .map((c) => c.index);
}

/**
 * Folds low-priority columns while the table is wider than its box. Measured before paint, so a folded
 * column never flashes; measured again from scratch when the box's width or the rows change.
 */
function useFoldedColumns<T>(columns: Column<T>[], rows: T[] | undefined) {
  const wrapRef = useRef<HTMLDivElement>(null);
  const tableRef = useRef<HTMLTableElement>(null);
  const [folded, setFolded] = useState<number[]>([]);
  const [, setResized] = useState(0);
  const order = foldOrder(columns);
  const orderKey = order.join(",");
  const measured = useRef<{ rows: T[] | undefined; orderKey: string; width: number } | null>(null);

  useLayoutEffect(() => {
    const wrap = wrapRef.current;
    const table = tableRef.current;
    if (!wrap || !table) return;
    const now = { rows, orderKey, width: wrap.clientWidth };
    const last = measured.current;
    if (!last || last.rows !== rows || last.orderKey !== orderKey || last.width !== now.width) {
      measured.current = now;
      if (folded.length) {
        setFolded([]); // start over; this effect folds again after that render
        return;
      }
    }
    if (table.offsetWidth <= wrap.clientWidth + 1) return;
    const next = order.find((index) => !folded.includes(index));
    if (next !== undefined) setFolded([...folded, next]);
  });

  useLayoutEffect(() => {
    const wrap = wrapRef.current;
    if (!wrap || typeof ResizeObserver === "undefined") return;
    const observer = new ResizeObserver(() => setResized((n) => n + 1));
    observer.observe(wrap);
    return () => observer.disconnect();
  }, []);

  return { wrapRef, tableRef, folded };
}

/** A plain data table; rows may be clickable (e.g. to open a detail page). */
export function Table<T>({ columns, rows, rowKey, loading, empty = "Nothing here yet.", pagination, onRowClick, rowClassName, testId }: TableProps<T>) {
  const { wrapRef, tableRef, folded } = useFoldedColumns(columns, rows);
  const [open, setOpen] = useState<Set<Key>>(new Set());
  const shown = columns.map((column, index) => ({ column, index })).filter(({ index }) => !folded.includes(index));
  const hidden = columns.map((column, index) => ({ column, index })).filter(({ index }) => folded.includes(index));
  const span = shown.length + (hidden.length ? 1 : 0);
  const toggle = (key: Key) =>
    setOpen((current) => {
      const next = new Set(current);
      if (next.has(key)) next.delete(key);
      else next.add(key);
      return next;
    });

  return (
    <div className="table-wrap" data-testid={testId} ref={wrapRef} data-folded={hidden.length || undefined}>
      <table className={loading ? "table table-loading" : "table"} ref={tableRef}>
        <thead>
          <tr>
            {shown.map(({ column, index }) => (
              <th key={index} className={column.className}>
                {column.header}
              </th>
            ))}
            {hidden.length > 0 && (
              <th className="fold-cell" title={`Folded to fit: ${hidden.map(({ column }) => labelOf(column)).join(", ")}`}>
                <span className="visually-hidden">Details</span>
              </th>
            )}
          </tr>
        </thead>
        <tbody>
          {rows === undefined ? (
            <tr>
              <td colSpan={span} className="table-empty">
                Loading…
              </td>
            </tr>
          ) : rows.length === 0 ? (
            <tr>
              <td colSpan={span} className="table-empty">
                {empty}
              </td>
            </tr>
          ) : (
            rows.map((row) => {
              const key = rowKey(row);
              const expanded = hidden.length > 0 && open.has(key);
              return (
                <Fragment key={key}>
                  <tr
                    className={[onRowClick ? "row-link" : "", rowClassName?.(row) ?? ""].filter(Boolean).join(" ") || undefined}
                    onClick={onRowClick ? () => onRowClick(row) : undefined}
                  >
                    {shown.map(({ column, index }) => (
                      <td key={index} className={cellClass(column)}>
                        {column.cell(row)}
                      </td>
                    ))}
                    {hidden.length > 0 && (
                      <td className="fold-cell">
                        <button
                          type="button"
                          className="fold-toggle"
                          aria-expanded={expanded}
                          aria-label={`${expanded ? "Hide" : "Show"} ${hidden.map(({ column }) => labelOf(column)).join(", ")}`}
                          title={`${expanded ? "Hide" : "Show"} ${hidden.map(({ column }) => labelOf(column)).join(", ")}`}
                          onClick={(event) => {
                            event.stopPropagation(); // the row's own click opens its page
                            toggle(key);
                          }}
                        >
                          {expanded ? "▾" : "▸"}
                        </button>
                      </td>
                    )}
                  </tr>
                  {expanded && (
                    <tr className="row-details">
                      <td colSpan={span}>
                        <dl className="fold-details">
                          {hidden.map(({ column, index }) => (
                            <Fragment key={index}>
                              <dt>{labelOf(column)}</dt>
                              <dd className={column.className?.includes("num") ? "num-inline" : undefined}>{column.cell(row)}</dd>
                            </Fragment>
                          ))}
                        </dl>
                      </td>
                    </tr>
                  )}
                </Fragment>
              );
            })
          )}
        </tbody>
      </table>
      {pagination}
    </div>
  );
}

/** A column's name as plain text: its label, or its header when that is text. */
function labelOf<T>(column: Column<T>): string {
  if (column.label) return column.label;
  return typeof column.header === "string" || typeof column.header === "number" ? String(column.header) : "";
}

interface PaginationProps {
  count: number;
  limit: number;
  offset: number;
  onOffset: (offset: number) => void;
}

/** Previous/next for DRF LimitOffsetPagination (`?limit=&offset=`). */
export function Pagination({ count, limit, offset, onOffset }: PaginationProps) {
  const first = count === 0 ? 0 : offset + 1;
  const last = Math.min(offset + limit, count);
  const page = Math.floor(offset / limit) + 1;
  const pages = Math.max(1, Math.ceil(count / limit));
  return (
    <div className="pagination">
      <span className="muted" data-testid="pagination-range">
        {first}–{last} of {count}
      </span>
      <span className="pagination-buttons">
        <button type="button" className="btn btn-small" disabled={offset <= 0} onClick={() => onOffset(Math.max(0, offset - limit))}>
          ← Previous
        </button>
        <span className="muted">
          Page {page} of {pages}
        </span>
        <button type="button" className="btn btn-small" disabled={offset + limit >= count} onClick={() => onOffset(offset + limit)}>
          Next →
        </button>
      </span>
    </div>
  );
}
