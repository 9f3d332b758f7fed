__all__ = ['ttypes', 'constants', 'Tidepool']
