package ssd

import (
	"fmt"
	"slices"
	"sort"

	"github.com/tidepool-kv/tidepool/cache/evict"
	"go.uber.org/zap"
)

func (t *Tier) nsLocked(ns string) *nsStats {
	s := t.nss[ns]
	if s == nil {
		s = &nsStats{}
		t.nss[ns] = s
	}
	return s
}

// insertLocked adds e to the index and the policy. mu held.
func (t *Tier) insertLocked(e *entry) {
	t.nextID++
	e.id = t.nextID
	t.index[e.skey] = e
	t.byID[e.id] = e
	t.policy.Admit(evict.Entry{ID: e.id, Size: e.foot, Depth: e.depth, LowPriority: e.lowPri})
	t.used += e.foot
	s := t.nsLocked(e.ns)
	s.blocks++
	s.bytes += e.size
	if o := t.cfg.Observer; o != nil {
		o.Stored(e.ns, e.userKey(), tierName, e.desc)
	}
}

// removeLocked drops e from the index and the policy. mu held.
func (t *Tier) removeLocked(e *entry) {
	t.unindexLocked(e)
	if o := t.cfg.Observer; o != nil {
		o.Removed(e.ns, e.userKey(), tierName)
	}
}

// unindexLocked is removeLocked without telling the Observer (Clear tells
// it once for the namespace). mu held.
func (t *Tier) unindexLocked(e *entry) {
	delete(t.index, e.skey)
	delete(t.byID, e.id)
	t.policy.Remove(e.id)
	t.used -= e.foot
	s := t.nsLocked(e.ns)
	s.blocks--
	s.bytes -= e.size
}

// resetIndex empties the index.
func (t *Tier) resetIndex() {
	t.mu.Lock()
	t.resetIndexLocked(0)
	t.mu.Unlock()
}

// tierName is this tier's name toward a cache.Observer.
const tierName = "ssd"

// userKey is the block's key without its namespace.
func (e *entry) userKey() []byte {
	_, key, _ := decodeKey([]byte(e.skey))
	return key
}

// resetIndexLocked empties the index, sized for n entries. mu held.
func (t *Tier) resetIndexLocked(n int) {
	if o := t.cfg.Observer; o != nil {
		for ns, s := range t.nss {
			if s.blocks > 0 {
				o.Cleared(ns, tierName)
			}
		}
	}
	t.index = make(map[string]*entry, n)
	t.byID = make(map[uint64]*entry, n)
	t.policy = t.cfg.Policy()
	t.used = 0
	for _, s := range t.nss {
		s.blocks, s.bytes = 0, 0
	}
}

func (t *Tier) restoreLocked(es []*entry) {
	for _, e := range es {
		t.insertLocked(e)
	}
}

// rebuild replaces the index with the contents of the metadata family,
// deleting undecodable records and evicting down to the capacity. It
// returns the blocks and value bytes kept.
func (t *Tier) rebuild() (blocks, bytes int64, err error) {
	var es []*entry
	var bad, lost [][]byte
	t.dbMu.RLock()
	if t.st == nil {
		t.dbMu.RUnlock()
		return 0, 0, errNoStore
	}
	err = t.st.scanMeta(func(k, rec []byte) {
		ns, _, kerr := decodeKey(k)
		m, merr := decodeMeta(rec)
		if kerr != nil || merr != nil {
			bad = append(bad, slices.Clone(k))
			return
		}
		if m.seg != 0 {
			if t.vlog == nil || !t.vlog.has(m.seg, m.off, m.size) {
				// Its bytes are gone (a segment deleted before a crash
				// lost the delete of this record).
				if t.vlog != nil {
					t.vlog.seen(m.seg)
				}
				lost = append(lost, slices.Clone(k))
				return
			}
		}
		es = append(es, &entry{
			ns: ns, skey: string(k), size: m.size, foot: footprint(len(k), m.size, m.desc),
			sum: m.sum, depth: m.depth, lowPri: m.lowPri, durable: m.durable, created: m.created, access: m.access,
			seg: m.seg, off: m.off, desc: m.desc,
		})
	})
	t.dbMu.RUnlock()
	if err != nil {
		return 0, 0, fmt.Errorf("ssd: scan metadata: %w", err)
	}
	// Oldest access first, so the policy sees the most recent last.
	sort.SliceStable(es, func(i, j int) bool { return es[i].access < es[j].access })

	t.mu.Lock()
	t.resetIndexLocked(len(es))
	for _, e := range es {
		t.insertLocked(e)
	}
	var victims [][]byte
	// A read-only store keeps every block: it cannot delete any, and a
	// reopen once space is back evicts down to the capacity.
	for t.used > t.cfg.Capacity && !t.st.readOnly {
		id, ok := t.policy.Victim(noSkip)
		if !ok {
			break
		}
		v := t.byID[id]
		if v == nil {
			t.policy.Remove(id)
			continue
		}
		t.removeLocked(v)
		victims = append(victims, v.encKey())
		t.countDurableEvictions([]*entry{v})
	}
	blocks = int64(len(t.index))
	live := make(map[uint32]int64)
	for _, e := range t.index {
		bytes += e.size
		if e.seg != 0 {
			live[e.seg] += aligned(e.size)
		}
	}
	t.mu.Unlock()
	if t.vlog != nil {
		t.vlog.setLive(live)
	}

	if len(bad) > 0 {
		t.lg.Warn("ssd metadata records unreadable, deleted", zap.Int("records", len(bad)))
	}
	if len(lost) > 0 {
		t.lg.Warn("ssd records whose value log bytes are gone, deleted", zap.Int("records", len(lost)))
	}
	if dels := slices.Concat(bad, lost, victims); len(dels) > 0 && !t.st.readOnly {
		if err := t.write(&batch{dels: dels}, false); err != nil {
			t.lg.Warn("ssd delete after rebuild failed", zap.Error(err))
		}
	}
	return blocks, bytes, nil
}
