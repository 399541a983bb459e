package redislock

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
)

// The few RESP2 types a lock connection meets: simple strings and bulk
// strings (string), integers (int64), nil, arrays ([]any) and error replies
// (ServerError, returned as the value, not as the read's error).

// writeCommand writes one command as an array of bulk strings.
func writeCommand(w *bufio.Writer, args []string) error {
	w.WriteByte('*')
	w.WriteString(strconv.Itoa(len(args)))
	w.WriteString("\r\n")
	for _, a := range args {
		w.WriteByte('$')
		w.WriteString(strconv.Itoa(len(a)))
		w.WriteString("\r\n")
		w.WriteString(a)
		w.WriteString("\r\n")
	}
	return w.Flush()
}

var errProtocol = errors.New("redislock: malformed reply")

// maxBulk bounds a bulk string or array a reply may announce, so a broken
// peer cannot make the reader allocate without end.
const maxBulk = 512 << 20

func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, errProtocol
	}
	return line[:len(line)-2], nil
}

// readReply reads one reply. The error is a transport or protocol error;
// an error reply comes back as a ServerError value.
func readReply(r *bufio.Reader) (any, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	body := string(line[1:])
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return ServerError(body), nil
	case ':':
		n, err := strconv.ParseInt(body, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: integer %q", errProtocol, body)
		}
		return n, nil
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulk {
			return nil, fmt.Errorf("%w: bulk length %q", errProtocol, body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := readFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulk {
			return nil, fmt.Errorf("%w: array length %q", errProtocol, body)
		}
		if n < 0 {
			return nil, nil
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	return nil, fmt.Errorf("%w: type %q", errProtocol, line[0])
}

func readFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
