// The time range of a history card's charts: 15 min, 1 h, 6 h or 24 h (the API picks the resolution).

export const RANGES = [
  { key: "15m", label: "15 min", seconds: 900 },
  { key: "1h", label: "1 h", seconds: 3600 },
  { key: "6h", label: "6 h", seconds: 6 * 3600 },
  { key: "24h", label: "24 h", seconds: 86400 },
] as const;

export type RangeKey = (typeof RANGES)[number]["key"];

export function rangeSeconds(key: RangeKey): number {
  return RANGES.find((r) => r.key === key)?.seconds ?? 3600;
}

export function RangePicker({ value, onChange, testId = "range-picker" }: { value: RangeKey; onChange: (key: RangeKey) => void; testId?: string }) {
  return (
    <div className="range-picker" role="group" aria-label="Time range" data-testid={testId}>
      {RANGES.map((r) => (
        <button key={r.key} type="button" aria-pressed={value === r.key} onClick={() => onChange(r.key)} data-testid={`${testId}-${r.key}`}>
          {r.label}
        </button>
      ))}
    </div>
  );
}
