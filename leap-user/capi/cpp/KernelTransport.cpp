// KernelTransport.cpp: the original engine's KernelTransport over leap's
// kmod backend (/dev/leap_tensor of the leap_kmod module).

#include "KernelTransport.h"

#include <stdexcept>
#include <utility>

#include "LeapLink.h"

namespace Inference {
    KernelTransport::KernelTransport(const int port, std::string next_ip, const int next_port)
        : port(port), next_ip(std::move(next_ip)), next_port(next_port),
          // The module takes every chunk to its port, whatever the address.
          link_(std::make_unique<leap_detail::Link>("KernelTransport", "kmod", leap_detail::endpoint("0.0.0.0", port),
                                                    leap_detail::endpoint(this->next_ip, next_port))) {
    }

    KernelTransport::~KernelTransport() = default;

    void KernelTransport::initialize() { link_->open(packet_size_); }

    void KernelTransport::packet_size_changed(const size_t size) { link_->set_frame_len(size); }

    void KernelTransport::send(const void *data, const size_t size) { send_next(data, size); }

    void KernelTransport::recv(void *data, const size_t size) { recv_prev(data, size); }

    void KernelTransport::send_next(const void *data, const size_t size) { link_->send(data, size); }

    void KernelTransport::recv_prev(void *data, const size_t size) { link_->recv(data, size); }

    void KernelTransport::recv_next(void *, size_t) { link_->unsupported("recv_next"); }

    void KernelTransport::send_prev(const void *, size_t) { link_->unsupported("send_prev"); }

    void KernelTransport::send_multipart_next(const void *header, const size_t header_size, const void *data,
                                     const size_t data_size) {
        link_->send_multipart(header, header_size, data, data_size);
    }

    void KernelTransport::send_control(const ControlMessage &msg) { link_->send_control(msg, packet_size_); }

    bool KernelTransport::recv_control_nonblocking(ControlMessage &msg) { return link_->recv_control(msg); }
} // namespace Inference
