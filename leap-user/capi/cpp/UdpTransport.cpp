// UdpTransport.cpp: the original engine's UdpTransport over leap's UDP, or
// its XDP paths (LEAP_UDP_PATH=xdp|xdp-ringbuf, with LEAP_INTERFACE).

#include "UdpTransport.h"

#include <stdexcept>
#include <utility>

#include "LeapLink.h"

namespace Inference {
    UdpTransport::UdpTransport(std::string ip, const int port, std::string next_ip, const int next_port)
        : ip(std::move(ip)), port(port), next_ip(std::move(next_ip)), next_port(next_port),
          link_(std::make_unique<leap_detail::Link>("UdpTransport", "udp", leap_detail::endpoint(this->ip, port),
                                                    leap_detail::endpoint(this->next_ip, next_port))) {
    }

    UdpTransport::~UdpTransport() = default;

    void UdpTransport::initialize() { link_->open(packet_size_); }

    void UdpTransport::packet_size_changed(const size_t size) { link_->set_frame_len(size); }

    void UdpTransport::send(const void *data, const size_t size) { send_next(data, size); }

    void UdpTransport::recv(void *data, const size_t size) { recv_prev(data, size); }

    void UdpTransport::send_next(const void *data, const size_t size) { link_->send(data, size); }

    void UdpTransport::recv_prev(void *data, const size_t size) { link_->recv(data, size); }

    void UdpTransport::recv_next(void *, size_t) { link_->unsupported("recv_next"); }

    void UdpTransport::send_prev(const void *, size_t) { link_->unsupported("send_prev"); }

    void UdpTransport::send_multipart_next(const void *header, const size_t header_size, const void *data,
                                     const size_t data_size) {
        link_->send_multipart(header, header_size, data, data_size);
    }

    void UdpTransport::send_control(const ControlMessage &msg) { link_->send_control(msg, packet_size_); }

    bool UdpTransport::recv_control_nonblocking(ControlMessage &msg) { return link_->recv_control(msg); }
} // namespace Inference
