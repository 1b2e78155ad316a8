package secret

// Wait waits for a background re-read in progress: the tests' way to see one end.
func (s *Source) Wait() { s.wg.Wait() }
