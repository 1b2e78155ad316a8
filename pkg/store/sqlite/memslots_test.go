package sqlite

import "testing"

// TestMirrorWakesOnlyForADifference: a slot taken arms the mirror's copy; freed again before the
// copy, while the leases table holds no slot, it disarms it, so that nothing wakes between
// short requests; a table that holds slots gets its copy of the change.
func TestMirrorWakesOnlyForADifference(t *testing.T) {
	m := newMemSlots()
	defer m.copy.Stop()
	const now, expires = 1, 1_000
	if err := m.admit("org-a", "gen-1", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	if !m.armed {
		t.Fatal("a slot taken did not arm the mirror's copy")
	}
	m.release("org-a", "gen-1")
	if m.armed {
		t.Fatal("the slots are back to the empty table's, and the copy is still armed")
	}

	m.tableEmpty = false // as after a copy of a slot
	if err := m.admit("org-a", "gen-2", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	m.release("org-a", "gen-2")
	if !m.armed {
		t.Fatal("a change while the table holds slots did not arm the copy")
	}
}
