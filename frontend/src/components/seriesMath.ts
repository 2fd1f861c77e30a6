// Small transforms of chart series: a moving average (raw 1 Hz utilization is a solid block of noise), and
// one set of summary lines (min, mean, max) in place of one line per GPU past a handful.

/** Trailing moving average over `seconds` of time: each value becomes the mean of the values at times in
 * (t - seconds, t]. Gaps stay gaps: a null is not averaged over, and is left null. */
export function movingAverage(t: number[], values: (number | null)[], seconds: number): (number | null)[] {
  const out: (number | null)[] = new Array(values.length).fill(null);
  let from = 0;
  let sum = 0;
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v !== null && v !== undefined) {
      sum += v;
      n += 1;
    }
    while ((t[from] ?? Infinity) <= (t[i] ?? 0) - seconds) {
      const old = values[from];
      if (old !== null && old !== undefined) {
        sum -= old;
        n -= 1;
      }
      from += 1;
    }
    out[i] = v === null || v === undefined || n === 0 ? null : sum / n;
  }
  return out;
}

export interface Summary {
  min: (number | null)[];
  mean: (number | null)[];
  max: (number | null)[];
}

/** Across several lines on one time grid: at each time the min, mean and max of those with a value. */
export function acrossLines(lines: (number | null)[][], length: number): Summary {
  const out: Summary = { min: [], mean: [], max: [] };
  for (let i = 0; i < length; i++) {
    let lo: number | null = null;
    let hi: number | null = null;
    let sum = 0;
    let n = 0;
    for (const line of lines) {
      const v = line[i];
      if (v === null || v === undefined) continue;
      lo = lo === null ? v : Math.min(lo, v);
      hi = hi === null ? v : Math.max(hi, v);
      sum += v;
      n += 1;
    }
    out.min.push(lo);
    out.max.push(hi);
    out.mean.push(n ? sum / n : null);
  }
  return out;
}

/** Lines of several series sampled at their own times, on one grid of whole seconds (the union of their
 * times): for the live charts, whose GPUs each keep their own sample times. */
export function onOneGrid(tables: Array<{ t: number[]; values: (number | null)[] }>): { t: number[]; lines: (number | null)[][] } {
  const times = new Set<number>();
  for (const table of tables) for (const time of table.t) times.add(Math.round(time));
  const t = [...times].sort((a, b) => a - b);
  const index = new Map(t.map((time, i) => [time, i]));
  const lines = tables.map((table) => {
    const line: (number | null)[] = new Array(t.length).fill(null);
    table.t.forEach((time, i) => {
      line[index.get(Math.round(time)) ?? 0] = table.values[i] ?? null;
    });
    return line;
  });
  return { t, lines };
}
