// TcpTransport.cpp: the original engine's TcpTransport over leap's TCP
// (raw framing: the original's wire).

#include "TcpTransport.h"

#include <stdexcept>
#include <utility>

#include "LeapLink.h"

namespace Inference {
    TcpTransport::TcpTransport(std::string ip, const int port, std::string next_ip, const int next_port)
        : ip(std::move(ip)), port(port), next_ip(std::move(next_ip)), next_port(next_port),
          link_(std::make_unique<leap_detail::Link>("TcpTransport", "tcp", leap_detail::endpoint(this->ip, port),
                                                    leap_detail::endpoint(this->next_ip, next_port))) {
    }

    TcpTransport::~TcpTransport() = default;

    void TcpTransport::initialize() { link_->open(packet_size_); }

    void TcpTransport::packet_size_changed(const size_t size) { link_->set_frame_len(size); }

    void TcpTransport::send(const void *data, const size_t size) { send_next(data, size); }

    void TcpTransport::recv(void *data, const size_t size) { recv_prev(data, size); }

    void TcpTransport::send_next(const void *data, const size_t size) { link_->send(data, size); }

    void TcpTransport::recv_prev(void *data, const size_t size) { link_->recv(data, size); }

    // The original's TCP could also talk backwards on its two connections;
    // the engine never does, and leap's C API does not offer it.
    void TcpTransport::recv_next(void *, size_t) {
        throw std::runtime_error("TcpTransport::recv_next: not offered over leap (frames come from the previous node)");
    }

    void TcpTransport::send_prev(const void *, size_t) {
        throw std::runtime_error("TcpTransport::send_prev: not offered over leap (frames go to the next node)");
    }

    void TcpTransport::send_multipart_next(const void *header, const size_t header_size, const void *data,
                                     const size_t data_size) {
        link_->send_multipart(header, header_size, data, data_size);
    }

    void TcpTransport::send_control(const ControlMessage &msg) { link_->send_control(msg, packet_size_); }

    bool TcpTransport::recv_control_nonblocking(ControlMessage &msg) { return link_->recv_control(msg); }
} // namespace Inference
