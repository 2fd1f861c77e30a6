import type { Key, ReactNode } from "react";

export interface Column<T> {
  header: ReactNode;
  /** What the cell shows. */
  cell: (row: T) => ReactNode;
  className?: string;
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

/** A plain data table; rows may be clickable (e.g. to open a detail page). */
export function Table<T>({ columns, rows, rowKey, loading, empty = "Nothing here yet.", pagination, onRowClick, rowClassName, testId }: TableProps<T>) {
  return (
    <div className="table-wrap" data-testid={testId}>
      <table className={loading ? "table table-loading" : "table"}>
        <thead>
          <tr>
            {columns.map((column, index) => (
              <th key={index} className={column.className}>
                {column.header}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows === undefined ? (
            <tr>
              <td colSpan={columns.length} className="table-empty">
                Loading…
              </td>
            </tr>
          ) : rows.length === 0 ? (
            <tr>
              <td colSpan={columns.length} className="table-empty">
                {empty}
              </td>
            </tr>
          ) : (
            rows.map((row) => (
              <tr
                key={rowKey(row)}
                className={[onRowClick ? "row-link" : "", rowClassName?.(row) ?? ""].filter(Boolean).join(" ") || undefined}
                onClick={onRowClick ? () => onRowClick(row) : undefined}
              >
                {columns.map((column, index) => (
                  <td key={index} className={column.className}>
                    {column.cell(row)}
                  </td>
                ))}
              </tr>
            ))
          )}
        </tbody>
      </table>
      {pagination}
    </div>
  );
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
