package engineapi

// LentRequests returns how many requests s decoded from lent buffers.
func LentRequests(s *Server) int64 { return s.lender.Lent() }
