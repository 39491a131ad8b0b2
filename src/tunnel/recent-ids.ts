/** A bounded set of recent numbers; the oldest are forgotten first. */
export class RecentIds {
  private readonly ids = new Set<number>();

  constructor(private readonly capacity: number) {}

  add(id: number): void {
    this.ids.delete(id);
    this.ids.add(id);
    if (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value;
      if (oldest !== undefined) this.ids.delete(oldest);
    }
  }

  has(id: number): boolean {
    return this.ids.has(id);
  }
}
