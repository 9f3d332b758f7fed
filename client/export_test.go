package client

// Queued returns how many GetInto Acquires, PutFrom Reserves and PutFrom
// Commits of c wait behind a call in flight.
func Queued(c *Client) (acquire, reserve, commit int) {
	return c.zc.acquires.queued(), c.zc.reserves.queued(), c.zc.commits.queued()
}
